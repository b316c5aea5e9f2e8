//! `GET /v1/events`, `GET /v1/events/{id}` and `GET /v1/subjects/{subject_hash}`: what was
//! decided, read back without raw identifiers. Another tenant's ids are 404.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::auth::Authenticated;
use super::extract::{Path, Query};
use crate::app::AppState;
use crate::app::error::ApiError;
pub use crate::clock::rfc3339;
use crate::delivery::DeliveryStatus;
use crate::domain::ActionResult;
use crate::problem::Problem;
use crate::secrets::hex;
use crate::store::Scope;
use crate::store::{DeliveryRecord, EventRecord, SubjectState};

/// Largest page of events.
const MAX_PAGE: i64 = 100;

/// Query of `GET /v1/events`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Page size, 1 to 100 (default 20); a value outside is brought within.
    limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    before: Option<Uuid>,
}

/// An event as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventView {
    id: Uuid,
    #[serde(rename = "type")]
    signal_type: String,
    subject_hash: String,
    observed_at: String,
    #[schema(value_type = Object)]
    attributes: Value,
    #[schema(value_type = Object)]
    metadata: Value,
    decision: String,
    playbook_version: i64,
    rule: String,
    #[schema(value_type = Vec<crate::domain::ActionResult>)]
    actions: Value,
    created_at: String,
    /// The feed it came in through: `signals`, `set` (a Security Event Token) or `camara`.
    /// An unmapped feed event has type `unmapped` and decision `ignored`.
    feed: String,
    /// The signal's keyed digest (of subject, type and observation time): events with the same
    /// one are the same signal received more than once, under other keys or none. Absent for an
    /// unmapped feed event and for events stored before verdict recorded it.
    #[serde(skip_serializing_if = "Option::is_none")]
    signal_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deliveries: Option<Vec<DeliveryView>>,
}

/// A delivery as lists show it: its state and how many attempts it had.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryView {
    #[serde(flatten)]
    pub delivery: DeliveryState,
    /// Attempts made so far.
    pub attempts: i64,
}

/// What every view of a delivery shows. `GET /v1/deliveries/{id}` adds its attempts (the
/// list, under `attempts`) where lists show their number.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryState {
    pub id: Uuid,
    pub event_id: Uuid,
    pub webhook_id: String,
    #[schema(value_type = DeliveryStatus)]
    pub status: String,
    pub next_attempt_at: Option<String>,
    pub last_error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// `callback`, or the action a connector carries out.
    pub action: String,
    /// The connector an action request goes to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connector: Option<String>,
    /// The endpoint a callback goes to (absent once the endpoint is deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// A stored JSON column as a value (stored JSON is always ours and valid).
pub fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

impl From<EventRecord> for EventView {
    fn from(e: EventRecord) -> Self {
        let metadata = parse_json(&e.metadata());
        let actions = parse_json(&e.actions());
        Self {
            id: e.id,
            signal_type: e.signal_type,
            subject_hash: hex(&e.subject_hash),
            observed_at: rfc3339(e.observed_at),
            attributes: parse_json(&e.attributes),
            metadata,
            decision: e.decision.as_str().to_owned(),
            playbook_version: e.playbook_version,
            rule: e.rule,
            actions,
            created_at: rfc3339(e.created_at),
            feed: e.feed.as_str().to_owned(),
            signal_key: (!e.signal_key.is_empty()).then(|| hex(&e.signal_key)),
            deliveries: None,
        }
    }
}

impl From<DeliveryRecord> for DeliveryView {
    fn from(d: DeliveryRecord) -> Self {
        Self {
            attempts: d.attempts,
            delivery: d.into(),
        }
    }
}

impl From<DeliveryRecord> for DeliveryState {
    fn from(d: DeliveryRecord) -> Self {
        Self {
            id: d.id,
            event_id: d.event_id,
            webhook_id: d.webhook_id(),
            next_attempt_at: matches!(d.status, DeliveryStatus::Pending | DeliveryStatus::Failed)
                .then(|| rfc3339(d.next_attempt_at)),
            status: d.status.as_str().to_owned(),
            last_error: d.last_error,
            created_at: rfc3339(d.created_at),
            updated_at: rfc3339(d.updated_at),
            action: d.action,
            connector: d.connector,
            endpoint: d.endpoint,
        }
    }
}

/// A page of events, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EventPage {
    data: Vec<EventView>,
    /// Pass as `before` to get the next page; absent on the last page.
    next_cursor: Option<Uuid>,
}

/// `GET /v1/events`.
#[utoipa::path(get, path = "/v1/events", operation_id = "list_events", tag = "events", params(ListQuery),
    responses((status = 200, body = EventPage, description = "OK"), (status = 401, body = Problem, description = "Not authenticated")))]
pub async fn list(
    State(app): State<AppState>,
    auth: Authenticated,
    Query(q): Query<ListQuery>,
) -> Result<Json<EventPage>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let limit = q.limit.unwrap_or(20).clamp(1, MAX_PAGE);
    let events = app.store.events(tenant.id, q.before, limit).await?;
    let next_cursor = (events.len() as i64 == limit)
        .then(|| events.last().map(|e| e.id))
        .flatten();
    Ok(Json(EventPage {
        data: events.into_iter().map(EventView::from).collect(),
        next_cursor,
    }))
}

/// `GET /v1/events/{id}`, with the event's deliveries.
#[utoipa::path(get, path = "/v1/events/{id}", operation_id = "get_event", tag = "events",
    params(("id" = Uuid, Path, description = "The event id")),
    responses((status = 200, body = EventView, description = "OK"), (status = 404, body = Problem, description = "Not found")))]
pub async fn show(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<EventView>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let event = app
        .store
        .event(tenant.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let deliveries = app.store.deliveries_for_event(tenant.id, id).await?;
    let mut view = EventView::from(event);
    view.actions = with_request_outcomes(view.actions, &deliveries);
    view.deliveries = Some(deliveries.into_iter().map(DeliveryView::from).collect());
    Ok(Json(view))
}

/// The event's action outcomes, each connector call's as its request stands now.
fn with_request_outcomes(actions: Value, deliveries: &[DeliveryRecord]) -> Value {
    let Ok(results) = serde_json::from_value::<Vec<ActionResult>>(actions.clone()) else {
        return actions;
    };
    serde_json::to_value(crate::delivery::current_outcomes(results, deliveries)).unwrap_or(actions)
}

/// What stands against a subject.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SubjectView {
    subject_hash: String,
    lock: Option<Standing>,
    deny: Option<Standing>,
    open_cases: Vec<CaseView>,
    /// Its 50 newest events, newest first.
    events: Vec<Uuid>,
}

/// A lock or deny: the event that caused it and when.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Standing {
    event_id: Uuid,
    since: String,
}

/// An open case and the events attached to it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CaseView {
    id: Uuid,
    opened_at: String,
    events: Vec<Uuid>,
}

/// `GET /v1/subjects/{subject_hash}`.
#[utoipa::path(get, path = "/v1/subjects/{subject_hash}", operation_id = "get_subject", tag = "events",
    params(("subject_hash" = String, Path, description = "The subject's digest, as in responses: 64 hexadecimal digits; anything else is 404")),
    responses((status = 200, body = SubjectView, description = "OK"), (status = 404, body = Problem, description = "Not found")))]
pub async fn subject(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(subject_hash): Path<String>,
) -> Result<Json<SubjectView>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let digest = decode_hex(&subject_hash).ok_or(ApiError::NotFound)?;
    let state = app
        .store
        .subject(tenant.id, &digest)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(subject_view(&digest, state)))
}

/// A subject's state as the API shows it.
pub fn subject_view(digest: &[u8], state: SubjectState) -> SubjectView {
    let standing = |s: Option<(Uuid, i64)>| {
        s.map(|(event_id, at)| Standing {
            event_id,
            since: rfc3339(at),
        })
    };
    SubjectView {
        subject_hash: hex(digest),
        lock: standing(state.lock),
        deny: standing(state.deny),
        open_cases: state
            .open_cases
            .into_iter()
            .map(|(id, opened_at, events)| CaseView {
                id,
                opened_at: rfc3339(opened_at),
                events,
            })
            .collect(),
        events: state.events,
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}
