//! The group commit's statements that PostgreSQL runs fused, in fewer round trips.
//!
//! The shared group commit ([`super::pipeline`]) runs each step as its own multi-row statement:
//! about fifteen round trips a batch, each a wake-up on both sides, and on a busy machine the
//! wake-ups, not the rows, were most of a batch's time. Here data-modifying CTEs fuse the steps
//! that need no answer in between, each statement taking its rows as arrays (one shape whatever
//! the batch size, so each is parsed and planned once per connection).
//!
//! Most signals are settled by one statement, [`apply::APPLY`]: the held locks' re-check, the
//! new claims, every local effect of the acts that go ahead, the inline attempts' records, and,
//! for each act whose effects all came out as its own (a fresh signal, the common case), its
//! outbox row, event and key completion, built before the statement ran from the outcomes
//! expected of it ([`super::Expected`], built by each request before it queued). A batch is then three round trips: `BEGIN`, `APPLY`,
//! `COMMIT`. An act that found an effect or its callback already another event's (a duplicate
//! of a signal, or two signals about one subject in one batch) is finished after it with its
//! actual outcomes: [`outbox::OUTBOX`], whose envelopes need them, then [`finish::FINISH`],
//! whose bodies need the callbacks' outcomes; five round trips for that batch.
//!
//! The outcomes are those of the shared statements: an effect is `Done` where this signal's
//! event holds its row (inserted now, or already there), else `AlreadyDone`. One difference: a
//! row another transaction committed after this statement began is not visible to its
//! lookups, so it reads `AlreadyDone` (it is not this event's) and, for a case, the event is
//! not attached to that case.

mod apply;
mod arrays;
mod finish;
mod outbox;

pub(super) use apply::apply;
pub(super) use finish::finish;
pub(super) use outbox::outbox;

use std::collections::{HashMap, HashSet};

use super::pipeline::{ActOutcome, Finished};
use super::{Batch, NewDelivery, StoreError};
use crate::actions::{ActionKind, Applied};

/// How a batch's transaction begins: planning for lookups by key, whatever the tables'
/// statistics say.
///
/// The array statements are planned once per connection and their plan kept (a generic plan).
/// Planned while the tables were small (a new database, before autovacuum first analyses it),
/// the cheapest plan reads a whole table, and it would be kept while the table grows. Only
/// index lookups are wanted here, so the other plans are turned off for this transaction.
pub(super) const BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; \
     SET LOCAL enable_mergejoin = off";

/// The kind name [`apply::APPLY`] reports an action's outcome under.
fn kind_name(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LockAccount => "lock",
        ActionKind::Deny => "deny",
        ActionKind::ChargeStepUp => "ledger",
        ActionKind::OpenCase => "case",
        ActionKind::AlertCustomer => "alert",
        ActionKind::Callback => "callback",
    }
}

/// What [`apply::APPLY`] found: the claims won, the acts whose lock held, each live act's
/// effects, and the acts it settled, by index.
#[derive(Default)]
pub(super) struct Found {
    claims_won: HashSet<i32>,
    held: HashSet<i32>,
    effects: HashMap<(&'static str, i32), bool>,
    settled: HashSet<i32>,
}

/// A batch position as the statements carry it (a batch holds at most a few hundred rows).
fn index(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// Whether act `i`'s held lock passed [`apply::APPLY`]'s re-check.
pub(super) fn held(found: &Found, i: usize) -> bool {
    found.held.contains(&index(i))
}

/// Whether each claim inserted its key.
pub(super) fn claims_won(batch: &Batch, found: &Found) -> Vec<bool> {
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
                    let ours = found.effects.get(&(kind_name(action), index(i)));
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

/// The live acts [`apply::APPLY`] did not settle, to finish with their actual outcomes.
pub(super) fn unsettled(live: &[usize], found: &Found) -> Vec<usize> {
    live.iter()
        .copied()
        .filter(|&i| !found.settled.contains(&index(i)))
        .collect()
}

/// Per live act: its outcome, what it stores, and the outbox row its commit inserted.
pub(super) type Stored = (Vec<ActOutcome>, Vec<Finished>, Vec<Option<NewDelivery>>);

/// What each live act stores, in `live`'s order: what the acts [`apply::APPLY`] settled
/// expected to store, and for the others their actual outcomes (`outcomes`, `finished`,
/// `deliveries`, in `unsettled`'s order).
pub(super) fn in_live_order(
    batch: &Batch,
    live: &[usize],
    found: &Found,
    outcomes: Vec<ActOutcome>,
    finished: Vec<Finished>,
    deliveries: Vec<Option<NewDelivery>>,
) -> Result<Stored, StoreError> {
    let mut actual = outcomes.into_iter().zip(finished).zip(deliveries);
    let mut merged = (Vec::new(), Vec::new(), Vec::new());
    for &i in live {
        let stored = if found.settled.contains(&index(i)) {
            batch.acts.get(i).map(|act| {
                let e = &act.expected;
                ((e.outcome.clone(), e.finished.clone()), e.delivery.clone())
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
