//! The group commit's statements that PostgreSQL runs fused, in fewer round trips.
//!
//! The shared group commit ([`super::pipeline`]) runs each step as its own multi-row statement:
//! about fifteen round trips a batch, each a wake-up on both sides, and on a busy machine the
//! wake-ups, not the rows, were most of a batch's time. Here data-modifying CTEs fuse the steps
//! that need no answer in between, each statement taking its rows as arrays (one shape whatever
//! the batch size, so each is parsed and planned once per connection).
//!
//! Most signals are settled by one statement, [`apply()`]: the held locks' re-check, the
//! new claims, every local effect of the acts that go ahead, the inline attempts' records, and,
//! for each act whose effects all came out as its own (a fresh signal, the common case), its
//! outbox row, event and key completion, built before the statement ran from the outcomes
//! expected of it ([`super::Expected`], built by each request before it queued). A batch where
//! that is every act is one round trip: the statement runs alone (`alone`) and commits as it
//! ends. It holds the CTEs of only the local effects its batch asks for. An act that found an
//! effect or its callback already another event's (a duplicate of a signal, or two signals
//! about one subject in one batch) makes that statement abort, keeping nothing, and the batch
//! runs again as a transaction: `BEGIN`, the statement, then for those acts their actual
//! outcomes, [`outbox::OUTBOX`], whose envelopes need them, and
//! [`finish::FINISH`], whose bodies need the callbacks' outcomes, and `COMMIT`; six round
//! trips for that batch.
//!
//! The outcomes are those of the shared statements: an effect is `Done` where this signal's
//! event holds its row (inserted now, or already there), else `AlreadyDone`. One difference: a
//! row another transaction committed after this statement began is not visible to its
//! lookups, so it reads `AlreadyDone` (it is not this event's); a case opened so is still
//! found, through the subject's row the statement's insert met, and the event attached to it.
//! The converse holds for the subject's row ([`effects`]'s `SUBJECTS`): a lock, deny or open
//! case that an undo lifted or closed after this statement began still counts as held, so the
//! act reads `AlreadyDone` (or is attached to the case being closed), as if it had run just
//! before the undo.

mod apply;
mod effects;
mod finish;
mod inputs;
mod outbox;
mod params;
mod requests;

pub(super) use apply::apply;
#[cfg(test)]
pub(super) use apply::every_statement;
pub(super) use finish::finish;
pub(super) use outbox::outbox;
pub(super) use requests::requests;

use std::collections::{HashMap, HashSet};

use super::pipeline::{ActOutcome, Finished, batch_result, live_acts};
use super::{Batch, BatchResult, NewDelivery, StoreError};
use crate::domain::{ActionKind, Applied};

/// Whether `batch` may run [`apply()`] alone, committed as it ends: not when an attempt's
/// record disables its endpoint (one more statement).
pub(super) fn may_commit_alone(batch: &Batch) -> bool {
    !batch.attempts.iter().any(|a| a.next.disable_endpoint)
}

/// Whether [`apply()`], run alone, aborted because an act it let go ahead was not settled.
pub(super) fn left_unsettled(err: &StoreError) -> bool {
    match err {
        StoreError::Database(sqlx::Error::Database(db)) => {
            db.code().is_some_and(|code| code == apply::UNSETTLED)
        }
        _ => false,
    }
}

/// The acts that went ahead: the keyless ones and those whose lock [`apply()`] found
/// held, in batch order.
pub(super) fn live(batch: &Batch, found: &Found) -> Vec<usize> {
    live_acts(batch, |i, _| held(found, i))
}

/// The batch's result once committed: `actual`, the outcomes, stored records and outbox rows
/// of the acts [`apply()`] did not settle, in [`unsettled`]'s order.
pub(super) fn result(
    batch: &Batch,
    found: &Found,
    live: Vec<usize>,
    actual: Stored,
) -> Result<BatchResult, StoreError> {
    let (outcomes, finished, deliveries) = actual;
    let (outcomes, finished, deliveries) =
        in_live_order(batch, &live, found, outcomes, finished, deliveries)?;
    Ok(batch_result(
        batch,
        live,
        outcomes,
        finished,
        deliveries,
        claims_won(batch, found),
    ))
}

/// What [`apply()`] found: the claims won, the acts whose lock held, each live act's
/// effects, and the acts it settled, by index.
#[derive(Default)]
pub(super) struct Found {
    claims_won: HashSet<i32>,
    held: HashSet<i32>,
    effects: HashMap<(ActionKind, i32), bool>,
    settled: HashSet<i32>,
}

/// A batch position as the statements carry it (a batch holds at most a few hundred rows).
fn index(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// Whether act `i`'s held lock passed [`apply()`]'s re-check.
pub(super) fn held(found: &Found, i: usize) -> bool {
    found.held.contains(&index(i))
}

/// Whether each claim inserted its key.
fn claims_won(batch: &Batch, found: &Found) -> Vec<bool> {
    (0..batch.claims.len())
        .map(|i| found.claims_won.contains(&index(i)))
        .collect()
}

/// Each live act's local effects, in [`ActionKind::LOCAL`] order, as the shared path records
/// them.
pub(super) fn outcomes_of(batch: &Batch, live: &[usize], found: &Found) -> Vec<ActOutcome> {
    live.iter()
        .map(|&i| {
            let act = &batch.acts[i];
            let effects = ActionKind::LOCAL
                .into_iter()
                .filter(|action| act.effects.contains(action))
                .map(|action| {
                    let ours = found.effects.get(&(action, index(i)));
                    let applied = if ours == Some(&true) {
                        Applied::Done
                    } else {
                        Applied::AlreadyDone
                    };
                    (action, applied)
                })
                .collect();
            ActOutcome {
                effects,
                ..ActOutcome::default()
            }
        })
        .collect()
}

/// The live acts [`apply()`] did not settle, to finish with their actual outcomes.
pub(super) fn unsettled(live: &[usize], found: &Found) -> Vec<usize> {
    live.iter()
        .copied()
        .filter(|&i| !found.settled.contains(&index(i)))
        .collect()
}

/// Per live act: its outcome, what it stores, and the outbox rows its commit inserted.
pub(super) type Stored = (Vec<ActOutcome>, Vec<Finished>, Vec<Vec<NewDelivery>>);

/// What each live act stores, in `live`'s order: what the acts [`apply()`] settled
/// expected to store, and for the others their actual outcomes (`outcomes`, `finished`,
/// `deliveries`, in `unsettled`'s order).
fn in_live_order(
    batch: &Batch,
    live: &[usize],
    found: &Found,
    outcomes: Vec<ActOutcome>,
    finished: Vec<Finished>,
    deliveries: Vec<Vec<NewDelivery>>,
) -> Result<Stored, StoreError> {
    let mut actual = outcomes.into_iter().zip(finished).zip(deliveries);
    let mut merged = (Vec::new(), Vec::new(), Vec::new());
    for &i in live {
        let stored = if found.settled.contains(&index(i)) {
            batch.acts.get(i).map(|act| {
                let e = &act.expected;
                (
                    (e.outcome.clone(), e.finished.clone()),
                    e.deliveries.clone(),
                )
            })
        } else {
            actual.next()
        };
        let ((outcome, finished), delivery) =
            stored.ok_or_else(|| StoreError::Corrupt("a live act with no outcome".into()))?;
        merged.0.push(outcome);
        merged.1.push(finished);
        merged.2.push(delivery);
    }
    Ok(merged)
}
