//! `POST /v1/subjects/lookup` (a subject by the identifier an analyst holds) and the way back:
//! `POST /v1/subjects/unlock`, `/lift-deny` and `/close-case` (admin scope), each with an
//! optional `Idempotency-Key`. The identifier comes in the body, so it never reaches a path, a
//! log line or the database.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::auth::Authenticated;
use super::events::{SubjectView, subject_view};
use crate::app::AppState;
use crate::app::error::ApiError;
use crate::domain::ActionKind;
use crate::problem::Problem;
use crate::signal::{Subject, subject_of};
use crate::store::Scope;
use crate::subjects::{self, Answer, Asked, Operator, Undone, WayBack, WhoIs};

/// The largest body an operator's request takes: a subject and a reason of 500 characters.
pub(super) const MAX_OPERATOR_BODY_BYTES: usize = 8 * 1024;

/// The subject a body names, checked as a signal's is.
fn subject(who: WhoIs) -> Result<Subject, ApiError> {
    Ok(subject_of(who.phone, who.account)?)
}

/// `POST /v1/subjects/lookup`: the subject's lock, deny, open cases and newest events, found by
/// its phone number or account (digested on the server, never stored or logged).
#[utoipa::path(post, path = "/v1/subjects/lookup", operation_id = "lookup_subject",
    tag = "subjects",
    request_body(content = crate::signal::WireSubject, content_type = "application/json"),
    responses((status = 200, body = SubjectView, description = "OK"),
        (status = 400, body = Problem, description = "Not exactly one valid phone or account"),
        (status = 404, body = Problem, description = "No event about this subject")))]
pub async fn lookup(
    State(app): State<AppState>,
    auth: Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SubjectView>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let body = super::body::read_limited(&headers, body, MAX_OPERATOR_BODY_BYTES).await?;
    let who: WhoIs = serde_json::from_slice(&body).map_err(|e| {
        ApiError::Invalid(format!(
            "the body must be {{\"phone\"}} or {{\"account\"}}: {e}"
        ))
    })?;
    let found = subjects::lookup(&*app.store, &app.keys, tenant.id, &subject(who)?)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(subject_view(&found.0, found.1)))
}

async fn way_back(
    app: &AppState,
    auth: &Authenticated,
    headers: &HeaderMap,
    action: ActionKind,
    body: &[u8],
) -> Result<Response, ApiError> {
    let key = super::signals::idempotency_key(headers)?;
    let tenant = auth.require(Scope::Admin)?;
    let WayBack {
        subject: who,
        reason,
    } = serde_json::from_slice(body).map_err(|e| {
        ApiError::Invalid(format!(
            "the body must be {{\"subject\": {{\"phone\"|\"account\"}}, \"reason\": \"…\"}}: {e}"
        ))
    })?;
    let subject = subject(who)?;
    let (playbook, version) = app.ingest.playbook_in_force(tenant.id).await?;
    let means = app.way_back_means();
    let asked = Asked {
        operator: Operator {
            tenant_id: tenant.id,
            key_id: auth.key_id(),
        },
        playbook: (&playbook, version),
        action,
        subject: &subject,
        reason: &reason,
        key: key.as_ref(),
    };
    Ok(match subjects::undo(&means, &asked).await? {
        Answer::Fresh(undone) => Json(undone).into_response(),
        Answer::Replayed(stored) => super::signals::stored_response(stored, true),
    })
}

/// `POST /v1/subjects/unlock`: removes the subject's account lock and re-activates the account
/// through the connector `lock_account` is bound to; `already_done` when it holds no lock.
#[utoipa::path(post, path = "/v1/subjects/unlock", operation_id = "unlock_subject",
    tag = "subjects",
    request_body(content = WayBack, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters, bare or as a quoted Structured Field string: a retry with the same key and body gets the stored answer, with `Idempotent-Replayed: true`",
        pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#)),
    responses((status = 200, body = Undone, description = "Unlocked, or nothing to unlock; with `Idempotent-Replayed: true` when replayed"),
        (status = 400, body = Problem, description = "Invalid subject, reason or Idempotency-Key"),
        (status = 409, body = Problem, description = "In progress under this Idempotency-Key; retry after `Retry-After`"),
        (status = 422, body = Problem, description = "The Idempotency-Key was used with another subject or reason")))]
pub async fn unlock(
    State(app): State<AppState>,
    auth: Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::read_limited(&headers, body, MAX_OPERATOR_BODY_BYTES).await?;
    way_back(&app, &auth, &headers, ActionKind::UnlockAccount, &body).await
}

/// `POST /v1/subjects/lift-deny`: lifts the subject's standing deny (through the connector
/// `deny` is bound to, if any); `already_done` when none stands.
#[utoipa::path(post, path = "/v1/subjects/lift-deny", operation_id = "lift_deny",
    tag = "subjects",
    request_body(content = WayBack, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters, bare or as a quoted Structured Field string: a retry with the same key and body gets the stored answer, with `Idempotent-Replayed: true`",
        pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#)),
    responses((status = 200, body = Undone, description = "Lifted, or nothing to lift; with `Idempotent-Replayed: true` when replayed"),
        (status = 400, body = Problem, description = "Invalid subject, reason or Idempotency-Key"),
        (status = 409, body = Problem, description = "In progress under this Idempotency-Key; retry after `Retry-After`"),
        (status = 422, body = Problem, description = "The Idempotency-Key was used with another subject or reason")))]
pub async fn lift_deny(
    State(app): State<AppState>,
    auth: Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::read_limited(&headers, body, MAX_OPERATOR_BODY_BYTES).await?;
    way_back(&app, &auth, &headers, ActionKind::LiftDeny, &body).await
}

/// `POST /v1/subjects/close-case`: closes the subject's open case (through the connector
/// `open_case` is bound to, if any); `already_done` when none is open.
#[utoipa::path(post, path = "/v1/subjects/close-case", operation_id = "close_case",
    tag = "subjects",
    request_body(content = WayBack, content_type = "application/json"),
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters, bare or as a quoted Structured Field string: a retry with the same key and body gets the stored answer, with `Idempotent-Replayed: true`",
        pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#)),
    responses((status = 200, body = Undone, description = "Closed, or nothing to close; with `Idempotent-Replayed: true` when replayed"),
        (status = 400, body = Problem, description = "Invalid subject, reason or Idempotency-Key"),
        (status = 409, body = Problem, description = "In progress under this Idempotency-Key; retry after `Retry-After`"),
        (status = 422, body = Problem, description = "The Idempotency-Key was used with another subject or reason")))]
pub async fn close_case(
    State(app): State<AppState>,
    auth: Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = super::body::read_limited(&headers, body, MAX_OPERATOR_BODY_BYTES).await?;
    way_back(&app, &auth, &headers, ActionKind::CloseCase, &body).await
}
