//! The rows the fused statements take that are not a table's rows: claims with their acts,
//! acts with the effects they ask for, attempts with the state they move their delivery to,
//! the responses keys complete with, and dispatched signals' completions. Each names its columns once ([`Row`]).

use uuid::Uuid;

use super::index;
use crate::domain::ActionKind;
use crate::store::rows::{Col, Row};
use crate::store::{
    Act, AttemptRecord, Batch, CallsDone, Claim, Finished, HeldKey, StoredResponse,
};

/// A claim as [`super::apply()`] takes it: alone, at its position among the batch's
/// claims, or with its act, at the act's position, completing the key with the act's expected
/// response.
pub(super) struct ClaimIn<'a> {
    claim: &'a Claim,
    alone: Option<i32>,
    act: Option<(i32, &'a Finished)>,
}

impl<'a> ClaimIn<'a> {
    /// The batch's claims: first those alone, then those that come with their acts.
    pub(super) fn of(batch: &'a Batch) -> Vec<Self> {
        let alone = batch.claims.iter().enumerate().map(|(i, claim)| Self {
            claim,
            alone: Some(index(i)),
            act: None,
        });
        let with_act = batch.acts.iter().enumerate().filter_map(|(i, act)| {
            act.claim.as_ref().map(|claim| Self {
                claim,
                alone: None,
                act: Some((index(i), &act.expected.finished)),
            })
        });
        alone.chain(with_act).collect()
    }
}

impl Row for ClaimIn<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::OptInt4("i", |c| c.alone),
            Col::Uuid("tenant_id", |c| c.claim.key.tenant_id),
            Col::Str("endpoint", |c| c.claim.key.endpoint),
            Col::Bytes("key_digest", |c| c.claim.key.digest.clone()),
            Col::Bytes("fingerprint", |c| c.claim.fingerprint.clone()),
            Col::Uuid("event_id", |c| c.claim.event_id),
            Col::Uuid("lock_token", |c| c.claim.lock_token),
            Col::Int8("locked_until", |c| c.claim.locked_until),
            Col::Int8("now", |c| c.claim.now),
            Col::Int8("expires_at", |c| c.claim.expires_at),
            // The decision is kept for a claim's recovery while in flight; one inserted with
            // its act never is, and its event holds the decision.
            Col::OptText("ruling", |c| {
                c.act.is_none().then(|| c.claim.ruling.clone())
            }),
            Col::OptInt4("act", |c| c.act.map(|(i, _)| i)),
            Col::OptInt4("status", |c| {
                c.act.map(|(_, f)| i32::from(f.response.status))
            }),
            Col::OptBytes("body", |c| c.act.and_then(|(_, f)| f.stored_body())),
            // `completed`, or `dispatched` (locked until then) for an act with connector calls.
            Col::OptStr("state", |c| c.act.map(|(_, f)| f.key_state.as_str())),
            Col::Int8("act_locked_until", |c| {
                c.act.map_or(0, |(_, f)| f.locked_until)
            }),
        ]
    }
}

/// An act as [`super::apply()`] takes it: its target, which local effects it asks for,
/// the ids a new ledger entry and a new case would get, and the key it holds, if any.
pub(super) struct ActIn<'a> {
    i: i32,
    act: &'a Act,
    ledger_id: Uuid,
    case_id: Uuid,
}

impl<'a> ActIn<'a> {
    /// The batch's acts, in order.
    pub(super) fn of(acts: &'a [Act]) -> Vec<Self> {
        acts.iter()
            .enumerate()
            .map(|(i, act)| Self {
                i: index(i),
                act,
                ledger_id: Uuid::now_v7(),
                case_id: Uuid::now_v7(),
            })
            .collect()
    }

    fn wants(&self, action: ActionKind) -> bool {
        self.act.effects.contains(&action)
    }

    fn held(&self) -> Option<&HeldKey> {
        self.act.held.as_ref()
    }
}

impl Row for ActIn<'_> {
    fn columns() -> Vec<Col<Self>> {
        let mut columns: Vec<Col<Self>> = vec![
            Col::Int4("i", |a| a.i),
            Col::Uuid("tenant_id", |a| a.act.target.tenant_id),
            Col::Uuid("event_id", |a| a.act.target.event_id),
            Col::Bytes("subject_hash", |a| a.act.target.subject_hash.clone()),
            Col::Bytes("signal_key", |a| a.act.target.signal_key.clone()),
            Col::Int8("observed_at", |a| a.act.target.observed_at),
            Col::Str("signal_type", |a| a.act.target.signal_type),
            Col::Int8("now", |a| a.act.target.now),
            Col::Uuid("ledger_id", |a| a.ledger_id),
            Col::Uuid("case_id", |a| a.case_id),
            Col::OptStr("endpoint", |a| a.held().map(|h| h.key.endpoint)),
            Col::OptBytes("key_digest", |a| a.held().map(|h| h.key.digest.clone())),
            Col::OptUuid("lock_token", |a| a.held().map(|h| h.lock_token)),
        ];
        // One boolean column per local action, named after it: whether the act asks for it.
        columns.extend(
            ActionKind::LOCAL
                .into_iter()
                .map(|action| Col::Wants(action, Self::wants)),
        );
        columns
    }
}

/// An inline attempt's record and the state it moves its delivery to.
impl Row for AttemptRecord {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("id", |t| t.id),
            Col::Uuid("delivery_id", |t| t.delivery_id),
            Col::Int8("attempted_at", |t| t.attempted_at),
            Col::Str("trigger_kind", |t| t.trigger),
            Col::OptInt4("status_code", |t| t.status_code),
            Col::Int8("latency_ms", |t| t.latency_ms),
            Col::OptText("error", |t| t.error.clone()),
            Col::OptBytes("excerpt", |t| t.response_excerpt.clone()),
            Col::Str("status", |t| t.next.status.as_str()),
            Col::Int8("retries_left", |t| t.next.retries_left),
            Col::Int8("next_attempt_at", |t| t.next.next_attempt_at),
        ]
    }
}

/// The response a completed key replays.
impl Row for StoredResponse {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Int4("status", |r| i32::from(r.status)),
            Col::Bytes("body", |r| r.body.clone()),
        ]
    }
}

/// A held key to complete (or move to `dispatched`) with its response, where the lock is
/// still this request's.
pub(super) struct Completion<'a> {
    pub held: &'a HeldKey,
    pub finished: &'a Finished,
}

impl Row for Completion<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("tenant_id", |c| c.held.key.tenant_id),
            Col::Str("endpoint", |c| c.held.key.endpoint),
            Col::Bytes("key_digest", |c| c.held.key.digest.clone()),
            Col::Uuid("lock_token", |c| c.held.lock_token),
            Col::Int4("status", |c| i32::from(c.finished.response.status)),
            Col::OptBytes("body", |c| c.finished.stored_body()),
            Col::Str("state", |c| c.finished.key_state.as_str()),
            Col::Int8("locked_until", |c| c.finished.locked_until),
        ]
    }
}

/// A dispatched signal whose calls answered: its event's action outcomes.
impl Row for CallsDone {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("event_id", |d| d.event_id),
            Col::Text("actions", |d| d.actions.clone()),
        ]
    }
}

/// A dispatched key still held, to complete with its final response.
pub(super) struct DispatchedKey<'a> {
    pub held: &'a HeldKey,
    pub response: &'a StoredResponse,
}

impl Row for DispatchedKey<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("tenant_id", |c| c.held.key.tenant_id),
            Col::Str("endpoint", |c| c.held.key.endpoint),
            Col::Bytes("key_digest", |c| c.held.key.digest.clone()),
            Col::Uuid("lock_token", |c| c.held.lock_token),
            Col::Int4("status", |c| i32::from(c.response.status)),
            Col::Bytes("body", |c| c.response.body.clone()),
        ]
    }
}

/// What a keyed act's key becomes if the act settles as expected: its response, and
/// `completed`, or `dispatched` (locked until then) while its connector calls are out.
pub(super) struct Settling<'a>(pub &'a Finished);

impl Row for Settling<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Int4("status", |s| i32::from(s.0.response.status)),
            Col::OptBytes("body", |s| s.0.stored_body()),
            Col::Str("state", |s| s.0.key_state.as_str()),
            Col::Int8("locked_until", |s| s.0.locked_until),
        ]
    }
}
