//! `GET /v1/deliveries`, `GET /v1/deliveries/{id}`, `POST /v1/deliveries/{id}/redeliver` and
//! `POST /v1/deliveries/{id}/resolve`.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::auth::Authenticated;
use super::events::{DeliveryState, DeliveryView, rfc3339};
use super::extract::{Path, Query};
use crate::app::AppState;
use crate::app::error::ApiError;
use crate::delivery::resolve::{self, Resolve};
use crate::delivery::{DeliveryStatus, REDELIVER_INTERVAL, Redelivered};
use crate::domain::EndpointName;
use crate::problem::Problem;
use crate::store::AttemptRow;
use crate::store::Scope;

/// Query of `GET /v1/deliveries`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only deliveries in this status.
    #[param(value_type = Option<DeliveryStatus>)]
    status: Option<String>,
    /// Page size, 1 to 500 (default 50); a value outside is brought within.
    limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    before: Option<Uuid>,
    /// Only the callbacks of the endpoint of this name.
    #[param(pattern = r"^[a-z][a-z0-9_-]{0,63}$")]
    endpoint: Option<String>,
}

/// A page of deliveries, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryPage {
    data: Vec<DeliveryView>,
    next_cursor: Option<Uuid>,
}

/// `GET /v1/deliveries?status=pending|succeeded|failed|dead|unknown|suspended`: callbacks and
/// connector calls.
#[utoipa::path(get, path = "/v1/deliveries", operation_id = "list_deliveries", tag = "deliveries", params(ListQuery),
    responses((status = 200, body = DeliveryPage, description = "OK"), (status = 400, body = Problem, description = "Invalid request")))]
pub async fn list(
    State(app): State<AppState>,
    auth: Authenticated,
    Query(q): Query<ListQuery>,
) -> Result<Json<DeliveryPage>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let status = q
        .status
        .as_deref()
        .map(str::parse::<DeliveryStatus>)
        .transpose()
        // Not echoed: a query string is the client's, and may be anything.
        .map_err(|_| {
            ApiError::Invalid(
                "`status` must be pending, succeeded, failed, dead, unknown or suspended".into(),
            )
        })?;
    let endpoint = q
        .endpoint
        .as_deref()
        .map(str::parse::<EndpointName>)
        .transpose()
        .map_err(|e| ApiError::Invalid(format!("`endpoint`: {e}")))?;
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let rows = app
        .store
        .deliveries(tenant.id, status, endpoint.as_ref(), q.before, limit)
        .await?;
    let next_cursor = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|d| d.id))
        .flatten();
    Ok(Json(DeliveryPage {
        data: rows.into_iter().map(DeliveryView::from).collect(),
        next_cursor,
    }))
}

/// An attempt as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AttemptView {
    pub attempted_at: String,
    pub trigger: String,
    pub status_code: Option<i32>,
    pub latency_ms: i64,
    pub error: Option<String>,
    /// The first 1 KiB of the response, as text where it is UTF-8.
    pub response: Option<String>,
    /// A resolution's API key (`trigger` `resolve`; the nil key when the CLI resolved it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_by: Option<Uuid>,
    /// A resolution's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<AttemptRow> for AttemptView {
    fn from(a: AttemptRow) -> Self {
        Self {
            attempted_at: rfc3339(a.attempted_at),
            trigger: a.trigger,
            status_code: a.status_code,
            latency_ms: a.latency_ms,
            error: a.error,
            response: a
                .response_excerpt
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
            resolved_by: a.resolved_by,
            reason: a.reason,
        }
    }
}

/// A delivery with its attempts (the list, where lists of deliveries show their number).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryDetail {
    #[serde(flatten)]
    pub delivery: DeliveryState,
    /// Every attempt, oldest first.
    pub attempts: Vec<AttemptView>,
}

impl DeliveryDetail {
    /// A delivery and its attempts, as stored.
    pub fn new(delivery: crate::store::DeliveryRecord, attempts: Vec<AttemptRow>) -> Self {
        Self {
            delivery: delivery.into(),
            attempts: attempts.into_iter().map(AttemptView::from).collect(),
        }
    }
}

/// `GET /v1/deliveries/{id}`.
#[utoipa::path(get, path = "/v1/deliveries/{id}", operation_id = "get_delivery", tag = "deliveries",
    params(("id" = Uuid, Path, description = "The delivery id")),
    responses((status = 200, body = DeliveryDetail, description = "OK"), (status = 404, body = Problem, description = "Not found")))]
pub async fn show(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(id): Path<String>,
) -> Result<Json<DeliveryDetail>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    detail(&app, tenant.id, id).await.map(Json)
}

async fn detail(app: &AppState, tenant_id: Uuid, id: Uuid) -> Result<DeliveryDetail, ApiError> {
    let (delivery, attempts) = app
        .store
        .delivery_with_attempts(tenant_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(DeliveryDetail::new(delivery, attempts))
}

/// `POST /v1/deliveries/{id}/redeliver`: another round of attempts, starting now, with the same
/// `webhook-id`; at most one per delivery every [`REDELIVER_INTERVAL`].
#[utoipa::path(post, path = "/v1/deliveries/{id}/redeliver", operation_id = "redeliver_delivery", tag = "deliveries",
    params(("id" = Uuid, Path, description = "The delivery id")),
    responses((status = 202, body = DeliveryDetail, description = "Accepted: attempted now"), (status = 404, body = Problem, description = "Not found"),
        (status = 409, body = Problem, description = "An attempt is in progress or the endpoint is disabled"),
        (status = 429, body = Problem, description = "Redelivered too recently; `Retry-After` says when it may be again")))]
pub async fn redeliver(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    // Distinguish "no such delivery" from "busy or endpoint disabled".
    app.store
        .delivery(tenant.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    match app.deliverer.redeliver(tenant.id, id).await? {
        Redelivered::Attempted(_) => Ok((
            StatusCode::ACCEPTED,
            Json(detail(&app, tenant.id, id).await?),
        )
            .into_response()),
        Redelivered::TooSoon(wait) => {
            let secs = u32::try_from(wait.as_millis().div_ceil(1000)).unwrap_or(u32::MAX);
            tracing::info!(delivery_id = %id, retry_after_secs = secs, "redelivery refused: too soon");
            Ok(Problem::new(
                "rate-limited",
                "Too many redeliveries of this delivery",
                StatusCode::TOO_MANY_REQUESTS,
            )
            .detail(format!(
                "A delivery is redelivered at most once every {} seconds; retry after {secs} s.",
                REDELIVER_INTERVAL.as_secs()
            ))
            .retry_after(secs)
            .into_response())
        }
        Redelivered::Unavailable => Err(ApiError::Conflict(
            Problem::new(
                "delivery-unavailable",
                "The delivery cannot be redelivered now",
                StatusCode::CONFLICT,
            )
            .detail(
                "An attempt is in progress, or the tenant's endpoint is disabled \
                 (re-enable it with `verdict tenant set-callback`).",
            ),
        )),
    }
}

/// `POST /v1/deliveries/{id}/resolve`: settles an action request whose outcome is `unknown` (an
/// at-most-once connector's call that may or may not have acted) as `done` or `failed`, once
/// someone has asked the tenant's system; records the API key and the reason as an attempt
/// (trigger `resolve`), and the event's action outcome follows. Nothing is called.
#[utoipa::path(post, path = "/v1/deliveries/{id}/resolve", operation_id = "resolve_delivery", tag = "deliveries",
    params(("id" = Uuid, Path, description = "The delivery id")),
    request_body(content = Resolve, content_type = "application/json"),
    responses((status = 200, body = DeliveryDetail, description = "Resolved: the request with its attempts, the resolution last"),
        (status = 400, body = Problem, description = "Not `done` or `failed`, or no reason of 1 to 500 characters"),
        (status = 404, body = Problem, description = "Not found"),
        (status = 409, body = Problem, description = "Not an action request whose outcome is `unknown`")))]
pub async fn resolve(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Result<Json<DeliveryDetail>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let body =
        super::body::read_limited(&headers, body, super::subjects::MAX_OPERATOR_BODY_BYTES).await?;
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let Resolve { outcome, reason } = serde_json::from_slice(&body).map_err(|e| {
        ApiError::Invalid(format!(
            "the body must be {{\"outcome\": \"done\"|\"failed\", \"reason\": \"…\"}}: {e}"
        ))
    })?;
    resolve::resolve(&*app.store, tenant.id, id, outcome, &reason, auth.key_id()).await?;
    Ok(Json(detail(&app, tenant.id, id).await?))
}
