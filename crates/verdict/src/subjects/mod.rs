//! Subjects as an analyst meets them: found by the phone number or account they hold (digested
//! here, never stored or logged), and the way back from a rule's effect: unlock the account,
//! lift the deny, close the case. Each is idempotent (a repeat finds nothing to undo), recorded
//! as an event with who and why, and carried to the tenant's system through the connector its
//! action is bound to (a SCIM user made `active` again, an HTTP connector's request).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::now_ms;
use crate::connectors::request::{ActionRequest, RequestSubject};
use crate::delivery::Deliverer;
use crate::delivery::schedule::{self, AttemptOutcome, Trigger};
use crate::domain::{ActionKind, ActionResult, Decision, Feed, Outcome};
use crate::playbook::Playbook;
use crate::secrets::{Keyring, hex};
use crate::signal::{Subject, subject_digest};
use crate::store::{
    ActionTarget, DueDelivery, NewEvent, RequestDraft, StoreError, SubjectState, Undo,
};

/// The longest reason an operator may give, in characters.
pub const MAX_REASON_CHARS: usize = 500;

pub use crate::store::ports::SubjectPort;

/// Why a way back could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SubjectError {
    #[error("`reason` must be 1 to {MAX_REASON_CHARS} characters, saying why")]
    Reason,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator's way back did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Undone {
    /// The event that records it; absent when there was nothing to undo.
    pub event_id: Option<Uuid>,
    pub subject_hash: String,
    pub action: ActionKind,
    /// `done`, `already_done` (nothing to undo), or the connector call's outcome.
    #[schema(value_type = String)]
    pub outcome: Outcome,
    /// The connector it was carried to, if the undone action is bound to one.
    #[serde(skip_serializing_if = "Option::is_none")]
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

/// Undoes `action`'s effect on `subject` (`action` one of [`ActionKind::OPERATOR`]), under
/// the bindings of `playbook` (the one in force, at `playbook_version`).
#[allow(clippy::too_many_arguments)]
pub async fn undo(
    store: &dyn SubjectPort,
    keys: &Keyring,
    deliverer: &Deliverer,
    operator: Operator,
    (playbook, playbook_version): (&Playbook, i64),
    action: ActionKind,
    subject: &Subject,
    reason: &str,
) -> Result<Undone, SubjectError> {
    if reason.trim().is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(SubjectError::Reason);
    }
    let tenant_id = operator.tenant_id;
    let digest = subject_digest(keys, tenant_id, subject);
    let now = now_ms();
    let event_id = Uuid::now_v7();
    let connector = action
        .undoes()
        .and_then(|undone| playbook.bindings_of(&[undone]).remove(&undone));
    let target = ActionTarget {
        tenant_id,
        event_id,
        subject_hash: digest.to_vec(),
        // Each way back is its own "signal": its request is one of its kind per event.
        signal_key: event_id.as_bytes().to_vec(),
        signal_type: event_type(action),
        now,
    };
    let lease = i64::try_from(deliverer.settings().lease().as_millis()).unwrap_or(i64::MAX);
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
            reason: Some(reason.to_owned()),
            metadata: Default::default(),
        };
        RequestDraft {
            action,
            connector,
            id: Uuid::now_v7(),
            webhook_id: format!("{event_id}:{}", action.as_str()),
            payload: body.seal(keys),
            leased_until: now.saturating_add(lease),
        }
    });
    let recorded = ActionResult {
        action,
        outcome: if request.is_some() {
            Outcome::Pending
        } else {
            Outcome::Done
        },
        connector: connector.clone(),
    };
    let event = NewEvent {
        id: event_id,
        tenant_id,
        signal_type: event_type(action),
        subject_hash: digest.to_vec(),
        observed_at: now,
        attributes: "{}".into(),
        metadata: serde_json::json!({ "by_key": operator.key_id, "reason": reason }).to_string(),
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
    };
    if !store.undo(&undo).await? {
        return Ok(Undone {
            event_id: None,
            subject_hash: hex(&digest),
            action,
            outcome: Outcome::AlreadyDone,
            connector,
        });
    }
    tracing::info!(%tenant_id, %event_id, action = action.as_str(), by_key = %operator.key_id,
        "an operator undid an effect");
    let outcome = match request {
        None => Outcome::Done,
        Some(r) => {
            let due = DueDelivery {
                id: r.id,
                tenant_id,
                event_id,
                webhook_id: r.webhook_id,
                payload: r.payload,
                retries_left: schedule::MAX_RETRIES,
                callback_url: None,
                action: action.as_str().to_owned(),
                connector: Some(r.connector.to_string()),
            };
            // Recorded with the delivery; `GET /v1/events/{id}` shows where it stands.
            match deliverer.attempt(&due, Trigger::Inline).await {
                Ok(attempt) => outcome_of(&attempt),
                Err(err) => {
                    tracing::warn!(error = ?err, "could not call the connector; the worker will");
                    Outcome::Pending
                }
            }
        }
    };
    Ok(Undone {
        event_id: Some(event_id),
        subject_hash: hex(&digest),
        action,
        outcome,
        connector,
    })
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
    #[schema(min_length = 1, max_length = 500, pattern = r"\S")]
    pub reason: String,
}
