//! `GET /v1/playbook` and `PUT /v1/playbook`: a tenant reads and replaces its playbook.

use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::auth::Authenticated;
use super::events::rfc3339;
use crate::app::AppState;
use crate::app::error::ApiError;
use crate::playbook::simulation::{self, MAX_SIMULATED_EVENTS, Simulation, Window};
use crate::playbook::{self, Format, Playbook, PlaybookStoreError};
use crate::problem::Problem;
use crate::store::Scope;

/// A playbook version as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PlaybookView {
    version: i64,
    format: String,
    source: String,
    created_at: Option<String>,
}

/// `GET /v1/playbook`: the version in force (version 0 is the built-in default).
#[utoipa::path(get, path = "/v1/playbook", operation_id = "get_playbook", tag = "playbook",
    responses((status = 200, body = PlaybookView, description = "OK"), (status = 401, body = Problem, description = "Not authenticated")))]
pub async fn show(
    State(app): State<AppState>,
    auth: Authenticated,
) -> Result<Json<PlaybookView>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let stored = playbook::current_source(&*app.store, tenant.id).await?;
    Ok(Json(PlaybookView {
        version: stored.version,
        format: stored.format,
        source: stored.source,
        created_at: (stored.created_at > 0).then(|| rfc3339(stored.created_at)),
    }))
}

/// The version a successful upload created.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Uploaded {
    version: i64,
}

/// `PUT /v1/playbook`: a TOML (`application/toml`) or JSON (`application/json`) document.
#[utoipa::path(put, path = "/v1/playbook", operation_id = "put_playbook", tag = "playbook",
    request_body(description = "The playbook document: TOML (`application/toml`, or any `text/*`), or JSON of the same shape",
        content((String = "application/toml"), (crate::playbook::Playbook = "application/json"))),
    responses((status = 201, body = Uploaded, description = "Created"), (status = 400, body = Problem, description = "Invalid playbook; the one in force stays"), (status = 413, body = Problem, description = "Larger than 64 KiB"), (status = 422, body = Problem, description = "Over a limit: rules, name lengths, windows")))]
pub async fn replace(
    State(app): State<AppState>,
    auth: Authenticated,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Uploaded>), ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let body = super::body::read_limited(&headers, body, playbook::MAX_PLAYBOOK_BYTES).await?;
    let (body, format) = document(&headers, &body)?;
    let version = playbook::upload(&*app.store, tenant.id, body, format).await?;
    tracing::info!(tenant_id = %tenant.id, version, "playbook replaced");
    Ok((StatusCode::CREATED, Json(Uploaded { version })))
}

/// The playbook document of a request body, and its format from the content type (sniffed when
/// the type says neither).
fn document<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<(&'a str, Format), ApiError> {
    let body = std::str::from_utf8(body)
        .map_err(|_| ApiError::Invalid("the playbook must be UTF-8 text".into()))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let format = if content_type.starts_with("application/json") {
        Format::Json
    } else if content_type.starts_with("application/toml") || content_type.starts_with("text/") {
        Format::Toml
    } else {
        Format::sniff(body)
    };
    Ok((body, format))
}

/// `POST /v1/playbook/simulate?since=&limit=`: what a candidate playbook would have decided for
/// the tenant's stored events, next to what was decided. Writes nothing.
#[utoipa::path(post, path = "/v1/playbook/simulate", operation_id = "simulate_playbook", tag = "playbook",
    params(
        ("since" = Option<String>, Query, format = DateTime, description = "RFC 3339: only events created at or after this time"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 10000, description = "The newest this many events (1 to 10000; default 1000)"),
    ),
    request_body(description = "The candidate playbook, TOML or JSON, validated as on upload",
        content((String = "application/toml"), (crate::playbook::Playbook = "application/json"))),
    responses((status = 200, body = Simulation, description = "The comparison"), (status = 400, body = Problem, description = "Invalid playbook or window"), (status = 413, body = Problem, description = "Larger than 64 KiB"), (status = 422, body = Problem, description = "Over a limit"),
        (status = 429, body = Problem, description = "One of this tenant's simulations is running; retry after `Retry-After`")))]
pub async fn simulate(
    State(app): State<AppState>,
    auth: Authenticated,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Simulation>, ApiError> {
    let tenant = auth.require(Scope::Read)?;
    let window = window(query.as_deref().unwrap_or(""))?;
    let body = super::body::read_limited(&headers, body, playbook::MAX_PLAYBOOK_BYTES).await?;
    let (body, format) = document(&headers, &body)?;
    let candidate = Playbook::parse(body, format).map_err(PlaybookStoreError::Invalid)?;
    let simulation = app
        .simulations
        .run(&*app.store, tenant.id, &candidate, window)
        .await?;
    tracing::info!(
        tenant_id = %tenant.id,
        examined = simulation.examined,
        changed = simulation.changed,
        "playbook simulated"
    );
    Ok(Json(simulation))
}

/// `since` (RFC 3339) and `limit` (1 to 10000) from a query string.
fn window(query: &str) -> Result<Window, ApiError> {
    let mut window = Window {
        since: None,
        limit: simulation::DEFAULT_SIMULATED_EVENTS,
    };
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match &*name {
            "since" => {
                let at = OffsetDateTime::parse(&value, &Rfc3339).map_err(|_| {
                    ApiError::Invalid("`since` must be an RFC 3339 date-time".into())
                })?;
                window.since = Some(crate::clock::to_ms(at));
            }
            "limit" => {
                window.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_SIMULATED_EVENTS).contains(n))
                    .ok_or_else(|| {
                        ApiError::Invalid(format!(
                            "`limit` must be a whole number from 1 to {MAX_SIMULATED_EVENTS}"
                        ))
                    })?;
            }
            _ => {
                return Err(ApiError::Invalid(
                    "the only query parameters are `since` and `limit`".into(),
                ));
            }
        }
    }
    Ok(window)
}
