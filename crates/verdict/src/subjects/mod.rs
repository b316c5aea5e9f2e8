//! Subjects as an analyst meets them: found by the phone number or account they hold (digested
//! here, never stored or logged), and the way back from a rule's effect: unlock the account,
//! lift the deny, close the case. Each is idempotent (a repeat finds nothing to undo), recorded
//! as an event with who and why, and carried to the tenant's system through the connector its
//! action is bound to (a SCIM user made `active` again, an HTTP connector's request).
//!
//! A way back may carry an `Idempotency-Key`, with the signals' contract: claimed in the key
//! table under the way back's own endpoint, moved on in the undo's own transaction
//! (`completed`, or `dispatched` while its connector call is out), and replayed with the same
//! body; another body under it is refused. The connector call runs on the background tracker,
//! not in the request's future: a client that goes away does not cancel it, and the call's
//! outcome still completes the key.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::connectors::request::{ActionRequest, RequestSubject};
use crate::delivery::Deliverer;
use crate::delivery::schedule::{self, AttemptOutcome, Trigger};
use crate::domain::{
    ActionKind, ActionResult, Decision, DeliveryStatus, Feed, InvalidReason, Outcome, Reason,
    webhook_id,
};
use crate::idempotency::{Fingerprint, IdempotencyKey};
use crate::playbook::Playbook;
use crate::secrets::{Keyring, hex};
use crate::signal::{Subject, subject_digest};
use crate::store::{
    ActionTarget, Claim, ClaimOutcome, DueDelivery, HeldKey, KeyRef, KeyedUndo, NewEvent,
    RecoveryPoint, RequestDraft, StoreError, StoredResponse, SubjectState, Undo,
};

pub use crate::domain::MAX_REASON_CHARS;
pub use crate::store::ports::SubjectPort;

/// Why a way back could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SubjectError {
    #[error(transparent)]
    Reason(#[from] InvalidReason),
    #[error("a way back with this idempotency key is in progress")]
    InProgress,
    #[error("this idempotency key was used with a different subject or reason")]
    KeyReused,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's way back did.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Undone {
    /// The event that records it; absent when there was nothing to undo.
    pub event_id: Option<Uuid>,
    pub subject_hash: String,
    pub action: ActionKind,
    /// `done`, `already_done` (nothing to undo), or the connector call's outcome.
    #[schema(value_type = String)]
    pub outcome: Outcome,
    /// The connector it was carried to, if the undone action is bound to one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub connector: Option<crate::domain::ConnectorName>,
}

/// Who asked, for the record.
#[derive(Clone, Copy, Debug)]
pub struct Operator {
    pub tenant_id: Uuid,
    /// The API key (or console session's key) that asked.
    pub key_id: Uuid,
}

/// How long a way back's key is remembered, and how long its lock protects it from a
/// takeover (the signals' settings).
#[derive(Clone, Copy, Debug)]
pub struct Keying {
    pub key_ttl_ms: i64,
    pub lock_timeout_ms: i64,
}

/// What the way back runs on.
pub struct Means<'a> {
    pub store: Arc<dyn SubjectPort>,
    pub keys: &'a Keyring,
    pub deliverer: Arc<Deliverer>,
    /// Where the connector call runs, off the request's future; shutdown waits for it.
    pub background: &'a TaskTracker,
    pub keying: Keying,
}

/// One way back, as an operator asked for it.
pub struct Asked<'a> {
    pub operator: Operator,
    /// The playbook in force and its version: its bindings name the connector called.
    pub playbook: (&'a Playbook, i64),
    /// One of [`ActionKind::OPERATOR`].
    pub action: ActionKind,
    pub subject: &'a Subject,
    /// Why, for the record: checked here (1 to [`MAX_REASON_CHARS`] characters).
    pub reason: &'a str,
    pub key: Option<&'a IdempotencyKey>,
}

/// How a way back ended.
#[derive(Debug)]
pub enum Answer {
    /// Taken by this request.
    Fresh(Undone),
    /// The stored response of a completed key, for the same subject and reason.
    Replayed(StoredResponse),
}

/// The endpoint part of a way back's idempotency keys: keys are scoped per tenant and way back.
pub fn endpoint(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LiftDeny => "POST /v1/subjects/lift-deny",
        ActionKind::CloseCase => "POST /v1/subjects/close-case",
        _ => "POST /v1/subjects/unlock",
    }
}

/// The subject's state, found by its raw identifier; `None` if the tenant has no event about it.
pub async fn lookup(
    store: &dyn SubjectPort,
    keys: &Keyring,
    tenant_id: Uuid,
    subject: &Subject,
) -> Result<Option<([u8; 32], SubjectState)>, StoreError> {
    let digest = subject_digest(keys, tenant_id, subject);
    Ok(store
        .subject(tenant_id, &digest)
        .await?
        .map(|state| (digest, state)))
}

/// The stored name of an operator event's type.
fn event_type(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LiftDeny => "operator.lift_deny",
        ActionKind::CloseCase => "operator.close_case",
        _ => "operator.unlock_account",
    }
}

/// Takes the way back `asked` for: at most once per key, the same answer for the same subject
/// and reason under it.
pub async fn undo(means: &Means<'_>, asked: &Asked<'_>) -> Result<Answer, SubjectError> {
    let reason = Reason::parse(asked.reason)?;
    let Some(key) = asked.key else {
        let undone = undo_now(means, asked, &reason, Uuid::now_v7(), None).await?;
        return Ok(Answer::Fresh(undone));
    };
    let tenant_id = asked.operator.tenant_id;
    let endpoint = endpoint(asked.action);
    let now = now_ms();
    let claim = Claim {
        key: KeyRef {
            tenant_id,
            endpoint,
            digest: means
                .keys
                .digest(&[b"idempotency-key", endpoint.as_bytes(), key.as_bytes()])
                .to_vec(),
        },
        fingerprint: fingerprint(means.keys, asked.subject, &reason),
        event_id: Uuid::now_v7(),
        lock_token: Uuid::new_v4(),
        now,
        locked_until: now.saturating_add(means.keying.lock_timeout_ms),
        expires_at: now.saturating_add(means.keying.key_ttl_ms),
        ruling: serde_json::json!({ "way_back": asked.action }).to_string(),
    };
    let held = HeldKey {
        key: claim.key.clone(),
        lock_token: claim.lock_token,
    };
    let taken = match means.store.claim(&claim).await? {
        ClaimOutcome::Started => undo_now(means, asked, &reason, claim.event_id, Some(&held)).await,
        ClaimOutcome::TakenOver {
            event_id,
            from: RecoveryPoint::InFlight { .. },
            ..
        } => {
            // Its holder died before the undo committed (the commit moves the key on).
            tracing::info!(%event_id, "took over an abandoned way back's key");
            undo_now(means, asked, &reason, event_id, Some(&held)).await
        }
        ClaimOutcome::TakenOver {
            event_id,
            from: RecoveryPoint::Calling { response },
            ..
        } => {
            tracing::info!(%event_id, "took over a way back's key with its call outstanding");
            resume(means, tenant_id, event_id, &response, &held).await
        }
        ClaimOutcome::TakenOver {
            from: RecoveryPoint::Dispatched { .. },
            ..
        } => Err(corrupt(
            "a way back's key holds a signal's recovery point".into(),
        )),
        ClaimOutcome::InProgress => return Err(SubjectError::InProgress),
        ClaimOutcome::Mismatch => return Err(SubjectError::KeyReused),
        ClaimOutcome::Completed { response, .. } => return Ok(Answer::Replayed(response)),
    };
    match taken {
        Ok(undone) => Ok(Answer::Fresh(undone)),
        Err(err) => {
            settle(&*means.store, &held, &err).await;
            Err(err)
        }
    }
}

/// The keyed digest of what a way back asks for (its subject and reason, as the canonical
/// JSON of the body that says them): the raw identifier is never stored, not even hashed
/// without a key.
fn fingerprint(keys: &Keyring, subject: &Subject, reason: &Reason) -> Vec<u8> {
    let who = match subject {
        Subject::Phone(phone) => serde_json::json!({ "phone": phone }),
        Subject::Account(account) => serde_json::json!({ "account": account }),
        Subject::Digested(digest) => serde_json::json!({ "digest": hex(digest) }),
    };
    let body = serde_json::json!({ "subject": who, "reason": reason.as_str() });
    // Strings and objects always have a canonical form.
    let canonical = Fingerprint::of(&body).map_or([0; 32], |f| f.0);
    keys.digest(&[b"way back fingerprint", &canonical]).to_vec()
}

/// After a failure with the key held: a transient one (or a call still out) releases the lock
/// so a retry resumes from where the key stands; a final one is stored and replayed. A lost
/// lock is not ours to touch.
async fn settle(store: &dyn SubjectPort, held: &HeldKey, err: &SubjectError) {
    let settled = match err {
        SubjectError::Store(StoreError::LockLost) => return,
        SubjectError::Store(e) if !e.is_transient() => {
            tracing::error!(error = ?e, "a way back failed permanently; storing the 500");
            let response = StoredResponse {
                status: 500,
                body: crate::problem::Problem::internal().to_json(),
            };
            store
                .complete_failed(&held.key, held.lock_token, &response)
                .await
        }
        _ => store.release(&held.key, held.lock_token).await,
    };
    if let Err(store) = settled {
        tracing::warn!(error = ?store, "could not settle a way back's key; its lock expires");
    }
}

fn corrupt(why: Box<dyn std::error::Error + Send + Sync>) -> SubjectError {
    SubjectError::Store(StoreError::Corrupt(why))
}

/// Undoes `asked.action`'s effect on `asked.subject`, recorded as event `event_id`, under the
/// bindings of the playbook in force; with `held`, moves the key on in the same transaction.
async fn undo_now(
    means: &Means<'_>,
    asked: &Asked<'_>,
    reason: &Reason,
    event_id: Uuid,
    held: Option<&HeldKey>,
) -> Result<Undone, SubjectError> {
    let (action, subject) = (asked.action, asked.subject);
    let (playbook, playbook_version) = asked.playbook;
    let tenant_id = asked.operator.tenant_id;
    let digest = subject_digest(means.keys, tenant_id, subject);
    let now = now_ms();
    let connector = action
        .undoes()
        .and_then(|undone| playbook.bindings_of(&[undone]).remove(&undone));
    let target = ActionTarget {
        tenant_id,
        event_id,
        subject_hash: digest.to_vec(),
        // Each way back is its own "signal": its request is one of its kind per event.
        signal_key: event_id.as_bytes().to_vec(),
        // Its time too: the id's own (UUIDv7) milliseconds, the same on every retry of it.
        observed_at: v7_millis(event_id),
        signal_type: event_type(action),
        now,
    };
    let request = connector.clone().map(|connector| {
        let body = ActionRequest {
            action: action.as_str().to_owned(),
            event_id,
            tenant: tenant_id,
            decision: None,
            rule: "operator".into(),
            signal_type: None,
            subject: match subject {
                Subject::Phone(p) => RequestSubject {
                    phone: Some(p.clone()),
                    account: None,
                },
                Subject::Account(a) => RequestSubject {
                    phone: None,
                    account: Some(a.clone()),
                },
                Subject::Digested(_) => RequestSubject::default(),
            },
            reason: Some(reason.as_str().to_owned()),
            metadata: Default::default(),
        };
        RequestDraft {
            action,
            connector,
            id: Uuid::now_v7(),
            webhook_id: webhook_id(tenant_id, event_id, action.as_str(), Uuid::nil()),
            payload: body.seal(means.keys),
            leased_until: now.saturating_add(lease_ms(&means.deliverer)),
        }
    });
    let undone = Undone {
        event_id: Some(event_id),
        subject_hash: hex(&digest),
        action,
        outcome: if request.is_some() {
            Outcome::Pending
        } else {
            Outcome::Done
        },
        connector: connector.clone(),
    };
    let nothing = Undone {
        event_id: None,
        outcome: Outcome::AlreadyDone,
        ..undone.clone()
    };
    let recorded = ActionResult {
        action,
        outcome: undone.outcome.clone(),
        connector,
    };
    let event = NewEvent {
        id: event_id,
        tenant_id,
        signal_type: event_type(action),
        subject_hash: digest.to_vec(),
        observed_at: now,
        attributes: "{}".into(),
        metadata: serde_json::json!({ "by_key": asked.operator.key_id, "reason": reason.as_str() })
            .to_string(),
        metadata_in_callback: false,
        // An operator's event decides nothing; it is never simulated again.
        decision: Decision::Ignored,
        playbook_version,
        rule: "operator".into(),
        actions: serde_json::to_string(&[&recorded]).unwrap_or_default(),
        created_at: now,
        evaluated_at: now,
        facts: "{}".into(),
        feed: Feed::Signals,
        signal_key: Vec::new(),
    };
    let undo = Undo {
        action,
        target,
        event,
        request: request.clone(),
        keyed: held.map(|held| KeyedUndo {
            held: held.clone(),
            undone: response(&undone),
            nothing: response(&nothing),
        }),
    };
    if !means.store.undo(&undo).await? {
        return Ok(nothing);
    }
    tracing::info!(%tenant_id, %event_id, action = action.as_str(),
        by_key = %asked.operator.key_id, "an operator undid an effect");
    let Some(r) = request else {
        return Ok(undone);
    };
    let due = DueDelivery {
        id: r.id,
        tenant_id,
        event_id,
        stored_webhook_id: r.webhook_id,
        payload: r.payload,
        retries_left: schedule::MAX_RETRIES,
        callback_url: None,
        action: action.as_str().to_owned(),
        connector: Some(r.connector.to_string()),
        endpoint_id: uuid::Uuid::nil(),
        endpoint_name: None,
        endpoint_secret: None,
    };
    Ok(call(means, due, undone, held.cloned()).await)
}

/// Finishes a way back whose holder died with its connector call out (`provisional`, the
/// response stored with the undo): calls its request again if it is still pending and due
/// (the same bytes, the same key), or completes the key with where it stands; in progress
/// while another call of it is out or its retry is not due.
async fn resume(
    means: &Means<'_>,
    tenant_id: Uuid,
    event_id: Uuid,
    provisional: &StoredResponse,
    held: &HeldKey,
) -> Result<Undone, SubjectError> {
    let undone: Undone =
        serde_json::from_slice(&provisional.body).map_err(|e| corrupt(Box::new(e)))?;
    let now = now_ms();
    let leased_until = now.saturating_add(lease_ms(&means.deliverer));
    let due = means
        .store
        .lease_requests(tenant_id, event_id, now, leased_until)
        .await?;
    if let Some(due) = due.into_iter().next() {
        return Ok(call(means, due, undone, Some(held.clone())).await);
    }
    let stands = means
        .store
        .request_statuses(tenant_id, event_id)
        .await?
        .into_iter()
        .find(|(action, _, _)| *action == undone.action);
    let outcome = match stands {
        Some((_, DeliveryStatus::Pending, _)) => return Err(SubjectError::InProgress),
        Some((_, status, error)) => Outcome::of_request(status, error.as_deref()),
        None => return Err(corrupt("a dispatched way back has no request".into())),
    };
    let undone = Undone { outcome, ..undone };
    complete(&*means.store, &undone, Some(held)).await?;
    Ok(undone)
}

/// Calls the connector for `due` on the background tracker and waits for its outcome: the
/// call, its record and the completion of the event (and of `held`, the key) go on if the
/// request's future is dropped (a client that disconnects, a request deadline).
async fn call(
    means: &Means<'_>,
    due: DueDelivery,
    provisional: Undone,
    held: Option<HeldKey>,
) -> Undone {
    let (store, deliverer) = (means.store.clone(), means.deliverer.clone());
    let (answered, answer) = oneshot::channel();
    let span = tracing::info_span!("way_back", delivery_id = %due.id, action = %due.action);
    let pending = provisional.clone();
    means.background.spawn(
        async move {
            // Recorded with the delivery; `GET /v1/events/{id}` shows where it stands.
            let outcome = match deliverer.attempt(&due, Trigger::Inline).await {
                Ok(attempt) => outcome_of(&attempt),
                Err(err) => {
                    tracing::warn!(error = ?err, "could not call the connector; the worker will");
                    Outcome::Pending
                }
            };
            let undone = Undone {
                outcome,
                ..provisional
            };
            if let Err(err) = complete(&*store, &undone, held.as_ref()).await {
                tracing::warn!(error = ?err,
                    "could not record a way back's outcome; a retry with its key finishes it");
            }
            let _ = answered.send(undone);
        }
        .instrument(span),
    );
    // Only a panic in the task drops the sender: the call's outcome is then unknown here.
    answer.await.unwrap_or(pending)
}

/// Stores a way back's outcome on its event and, with `held`, completes its key with it.
async fn complete(
    store: &dyn SubjectPort,
    undone: &Undone,
    held: Option<&HeldKey>,
) -> Result<(), StoreError> {
    let Some(event_id) = undone.event_id else {
        return Ok(());
    };
    let recorded = ActionResult {
        action: undone.action,
        outcome: undone.outcome.clone(),
        connector: undone.connector.clone(),
    };
    let actions = serde_json::to_string(&[&recorded]).unwrap_or_default();
    store
        .complete_dispatched(event_id, &actions, held, &response(undone))
        .await
}

/// A way back's answer as a key stores it.
fn response(undone: &Undone) -> StoredResponse {
    StoredResponse {
        status: 200,
        body: serde_json::to_vec(undone).unwrap_or_default(),
    }
}

/// How long an operator's call is leased to this process: one send, and its record.
fn lease_ms(deliverer: &Deliverer) -> i64 {
    i64::try_from(deliverer.settings().lease().as_millis()).unwrap_or(i64::MAX)
}

/// An action's outcome from the call an operator's way back made.
fn outcome_of(attempt: &AttemptOutcome) -> Outcome {
    match attempt {
        AttemptOutcome::Delivered => Outcome::Done,
        AttemptOutcome::Retryable { .. } => Outcome::Pending,
        AttemptOutcome::Unknown => Outcome::Unknown,
        AttemptOutcome::Terminal | AttemptOutcome::Gone => Outcome::Failed(
            "the connector refused the request (its delivery's attempts say why)".into(),
        ),
    }
}

/// The body of `POST /v1/subjects/lookup`: exactly one of `phone` or `account` (documented
/// as a signal's `Subject`, which it is checked as).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhoIs {
    pub phone: Option<String>,
    pub account: Option<String>,
}

/// The body of the way back: the subject and why.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WayBack {
    #[schema(value_type = crate::signal::WireSubject)]
    pub subject: WhoIs,
    /// Why, for the record: 1 to 500 characters, not all blank.
    #[schema(
        min_length = 1,
        max_length = 500,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    pub reason: String,
}

/// The unix milliseconds a UUIDv7 starts with.
fn v7_millis(id: Uuid) -> i64 {
    let b = id.as_bytes();
    i64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v7_ids_millis_are_when_it_was_made() {
        let before = crate::clock::now_ms();
        let id = Uuid::now_v7();
        let after = crate::clock::now_ms();
        assert!((before..=after).contains(&v7_millis(id)));
    }
}
