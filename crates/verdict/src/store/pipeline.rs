//! The group commit: the claims of the signals arriving now and their effects (or the effects
//! of the signals claimed earlier), written in one transaction of multi-row statements and one
//! commit.
//!
//! Each signal still gets its own outcome: a claim that finds its key taken, or an act whose
//! lock was taken over, is reported for that signal alone, and every effect is
//! `ON CONFLICT DO NOTHING`, so one signal's conflict never fails the others.

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    ActionTarget, AttemptRecord, Claim, KeyRef, NewDelivery, NewEvent, StoreError, StoredResponse,
};
use crate::domain::{ActionKind, Applied, ConnectorName, KeyState};

/// Prepared statements a connection keeps: about 16 multi-row statements or multi-statement
/// queries, each in one shape per batch size up to [`super::MAX_BATCH`], plus the
/// single-row ones.
pub(crate) const STATEMENT_SHAPES: usize = 16 * super::MAX_BATCH + 128;

/// A key held by the request that acts on it, and its lock token.
#[derive(Clone, Debug)]
pub struct HeldKey {
    pub key: KeyRef,
    pub lock_token: uuid::Uuid,
}

/// How each of a signal's effects came out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActOutcome {
    /// Each local action, in the order asked.
    pub effects: Vec<(ActionKind, Applied)>,
    /// The callback's outbox rows (one per matching endpoint), if any were asked for:
    /// `Done` where this signal's event holds them.
    pub callback: Option<Applied>,
    /// The outbox rows this commit inserted: only those get an inline attempt.
    pub callbacks_inserted: Vec<uuid::Uuid>,
    /// The connector action requests this signal's event holds, each with whether this commit
    /// inserted it (only then does its inline call go out).
    pub requests: Vec<(ActionKind, bool)>,
}

/// What a decided signal stores once its effects are known: its event and, for a keyed
/// signal, the response its key replays.
#[derive(Clone, Debug)]
pub struct Finished {
    pub event: NewEvent,
    pub response: StoredResponse,
    /// Where the key stands after the commit: `Completed`, or `Dispatched` while connector
    /// calls are outstanding (the response is then the one a crash would leave, every call
    /// `pending`).
    pub key_state: KeyState,
    /// Until when a dispatched key's lock protects the request finishing it (unix ms).
    pub locked_until: i64,
    /// Whether the response is its event's 200 as `SignalAnswer` renders it from the event's
    /// row: the key then stores no bytes of its own, and a replay renders them again.
    pub answer_in_event: bool,
}

impl Finished {
    /// The response bytes its key row stores: none when they are rendered from the event.
    pub fn stored_body(&self) -> Option<Vec<u8>> {
        (!self.answer_in_event).then(|| self.response.body.clone())
    }
}

/// What an act stores, built from its effects' outcomes inside its commit: the caller's part
/// of the transaction.
pub trait Render: Send + Sync {
    /// What the act stores for these outcomes: its event and, with a key, its response.
    fn finished(&self, outcome: &ActOutcome) -> Finished;
    /// The callback's envelope (its bytes, fixed from then on) for these local outcomes.
    fn envelope(&self, effects: &[(ActionKind, Applied)]) -> EnvelopeBytes;
}

/// A callback's envelope, and whether its event's row renders it again byte for byte
/// ([`crate::domain::CallbackEnvelope`]): the outbox row then stores no copy of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvelopeBytes {
    pub bytes: Vec<u8>,
    pub in_event: bool,
}

/// A callback to one endpoint to record in the outbox, its envelope rendered inside the
/// commit.
#[derive(Clone, Debug)]
pub struct CallbackDraft {
    pub id: uuid::Uuid,
    /// The endpoint it goes to.
    pub endpoint_id: uuid::Uuid,
    pub webhook_id: String,
    /// Reserved for the inline attempt until then; if the process dies, the worker takes it.
    pub leased_until: i64,
    /// `Pending`, or `Suspended` when the endpoint is disabled: then it is stored with its
    /// bytes but not attempted until the endpoint is re-enabled.
    pub status: crate::domain::DeliveryStatus,
}

/// A call to one of the tenant's connectors, recorded in the outbox with the act, its bytes
/// fixed: sent only if this event applied the action's local effect (a custom action has
/// none: its request is one per signal, which the outbox's uniqueness decides).
#[derive(Clone, Debug)]
pub struct RequestDraft {
    pub action: ActionKind,
    pub connector: ConnectorName,
    pub id: uuid::Uuid,
    /// `<event_id>:<action>`: the `Idempotency-Key` and `webhook-id` of every attempt.
    pub webhook_id: String,
    /// The action request, sealed (it holds the raw identifier the tenant's system needs).
    pub payload: Vec<u8>,
    /// Reserved for the inline call until then; if the process dies, the worker takes it.
    pub leased_until: i64,
}

/// A committed act: its outcomes, the response stored, and the outbox rows this commit
/// inserted (the inline attempts send exactly these bytes).
#[derive(Clone, Debug)]
pub struct Committed {
    pub outcome: ActOutcome,
    pub response: StoredResponse,
    pub deliveries: Vec<NewDelivery>,
}

/// One decided signal's effects, outbox row, event and (with a key) completion.
#[derive(Clone)]
pub struct Act {
    /// The key, if the signal has one: completed in the same transaction, if still ours.
    pub held: Option<HeldKey>,
    /// A fresh key's claim, inserted by the same commit ([`Act::claiming`]): the act goes
    /// ahead only if the claim wins, and the key is completed with it.
    pub claim: Option<Claim>,
    pub target: ActionTarget,
    /// The local actions to apply (the callback is `callbacks`).
    pub effects: Vec<ActionKind>,
    /// Its callback, one per endpoint that takes it.
    pub callbacks: Vec<CallbackDraft>,
    /// Its connector action requests, one per bound action.
    pub requests: Vec<RequestDraft>,
    /// Renders what it stores and its callback's envelope from the outcomes.
    pub render: Arc<dyn Render>,
    /// What it stores if everything it asks for comes out as its own, built by [`Act::new`].
    pub expected: Arc<Expected>,
}

/// What an act stores when each of its local effects is `Done` and its outbox row is inserted
/// now: what a fresh signal stores. Built by the request before it queues, so a committer
/// (which works one batch at a time) builds envelopes and bodies only for the acts that come
/// out otherwise.
#[derive(Clone, Debug)]
pub struct Expected {
    pub outcome: ActOutcome,
    pub deliveries: Vec<NewDelivery>,
    pub finished: Finished,
}

impl Act {
    /// An act, with what it stores if everything comes out as its own.
    pub fn new(
        held: Option<HeldKey>,
        target: ActionTarget,
        effects: Vec<ActionKind>,
        callbacks: Vec<CallbackDraft>,
        requests: Vec<RequestDraft>,
        render: Arc<dyn Render>,
    ) -> Self {
        let done: Vec<(ActionKind, Applied)> = ActionKind::LOCAL
            .into_iter()
            .filter(|action| effects.contains(action))
            .map(|action| (action, Applied::Done))
            .collect();
        let deliveries = deliveries_of(&callbacks, &*render, &done);
        let outcome = ActOutcome {
            effects: done,
            callback: (!callbacks.is_empty()).then_some(Applied::Done),
            callbacks_inserted: callbacks.iter().map(|c| c.id).collect(),
            requests: requests.iter().map(|r| (r.action, true)).collect(),
        };
        let finished = render.finished(&outcome);
        Self {
            held,
            claim: None,
            target,
            effects,
            callbacks,
            requests,
            render,
            expected: Arc::new(Expected {
                outcome,
                deliveries,
                finished,
            }),
        }
    }

    /// The act of a fresh key, committed with the key's claim: it holds the key only if the
    /// claim wins in the same commit, so a duplicate's act never goes ahead.
    pub fn claiming(self, claim: Claim) -> Self {
        Self {
            held: Some(HeldKey {
                key: claim.key.clone(),
                lock_token: claim.lock_token,
            }),
            claim: Some(claim),
            ..self
        }
    }

    /// The action requests to record for local effects that came out as `effects`: those of
    /// the actions this event applied, and every custom action's.
    pub(crate) fn requests_for(&self, effects: &[(ActionKind, Applied)]) -> Vec<&RequestDraft> {
        self.requests
            .iter()
            .filter(|r| r.action.is_custom() || effects.contains(&(r.action, Applied::Done)))
            .collect()
    }

    /// Its outbox rows for local effects that came out as `effects`.
    pub(crate) fn deliveries_for(&self, effects: &[(ActionKind, Applied)]) -> Vec<NewDelivery> {
        if self.expected.outcome.effects == effects {
            return self.expected.deliveries.clone();
        }
        deliveries_of(&self.callbacks, &*self.render, effects)
    }

    /// What it stores for `outcome`.
    pub(crate) fn finished_for(&self, outcome: &ActOutcome) -> Finished {
        if self.expected.outcome == *outcome {
            return self.expected.finished.clone();
        }
        self.render.finished(outcome)
    }
}

/// The outbox rows of a callback, one per endpoint, its envelope rendered once from `effects`.
fn deliveries_of(
    callbacks: &[CallbackDraft],
    render: &dyn Render,
    effects: &[(ActionKind, Applied)],
) -> Vec<NewDelivery> {
    if callbacks.is_empty() {
        return Vec::new();
    }
    let envelope = render.envelope(effects);
    callbacks
        .iter()
        .map(|c| NewDelivery {
            id: c.id,
            webhook_id: c.webhook_id.clone(),
            payload: envelope.bytes.clone(),
            payload_in_event: envelope.in_event,
            leased_until: c.leased_until,
            status: c.status,
            endpoint_id: c.endpoint_id,
        })
        .collect()
}

/// A dispatched signal whose connector calls answered: its event's action outcomes and, with a
/// key still held, the key completed with its final response.
#[derive(Clone, Debug)]
pub struct CallsDone {
    pub event_id: uuid::Uuid,
    /// The event's action outcomes, JSON.
    pub actions: String,
    pub held: Option<HeldKey>,
    pub response: StoredResponse,
}

/// Work for one group commit.
#[derive(Clone, Default)]
pub struct Batch {
    pub claims: Vec<Claim>,
    pub acts: Vec<Act>,
    /// Inline callback attempts to record (each delivery's state moves with its attempt).
    pub attempts: Vec<AttemptRecord>,
    /// Dispatched signals whose calls answered, to complete.
    pub calls_done: Vec<CallsDone>,
    /// At most one customer alert per subject and signal type within this window.
    pub alert_window_ms: i64,
}

/// Each signal's outcome, in the batch's order.
#[derive(Debug, Default)]
pub struct BatchResult {
    /// Whether each claim inserted its key (a `false` goes through [`super::KeyStore::claim`]).
    pub claims: Vec<bool>,
    /// Each act's outcome; `Err(LockLost)` where another request took the key over, or had
    /// it already when the act came with its claim.
    pub acts: Vec<Result<Committed, StoreError>>,
}

/// The group commit.
#[async_trait]
pub trait PipelineStore: Send + Sync {
    /// Writes a batch in one transaction. An `Err` means nothing of the batch was stored.
    async fn commit(&self, batch: &Batch) -> Result<BatchResult, StoreError>;
}

/// The acts that go ahead, by index in the batch: the keyless ones and those whose held key
/// `still_ours` confirms (as the held locks' re-check found it).
pub(crate) fn live_acts(batch: &Batch, still_ours: impl Fn(usize, &HeldKey) -> bool) -> Vec<usize> {
    (0..batch.acts.len())
        .filter(|&i| batch.acts[i].held.as_ref().is_none_or(|h| still_ours(i, h)))
        .collect()
}

/// Each request's answer from a committed batch: the live acts' outcomes (in `live`'s order),
/// and `LockLost` for an act whose key another request took over or claimed first.
pub(crate) fn batch_result(
    batch: &Batch,
    live: Vec<usize>,
    outcomes: Vec<ActOutcome>,
    finished: Vec<Finished>,
    deliveries: Vec<Vec<NewDelivery>>,
    claims: Vec<bool>,
) -> BatchResult {
    let mut committed = outcomes.into_iter().zip(finished).zip(deliveries).map(
        |((outcome, finished), mut deliveries)| {
            deliveries.retain(|d| outcome.callbacks_inserted.contains(&d.id));
            Committed {
                deliveries,
                outcome,
                response: finished.response,
            }
        },
    );
    let mut live = live.into_iter().peekable();
    let acts = (0..batch.acts.len())
        .map(|i| match live.next_if_eq(&i) {
            Some(_) => committed.next().ok_or(StoreError::LockLost),
            None => Err(StoreError::LockLost),
        })
        .collect();
    BatchResult { claims, acts }
}
