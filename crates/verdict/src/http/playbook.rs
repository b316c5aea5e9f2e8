//! `GET /v1/playbook` and `PUT /v1/playbook`: a tenant reads and replaces its playbook.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Serialize;

use super::AppState;
use super::auth::Authenticated;
use super::error::ApiError;
use super::events::rfc3339;
use super::problem::Problem;
use crate::playbook::{self, Format};
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
    let body = std::str::from_utf8(&body)
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
    let version = playbook::upload(&*app.store, tenant.id, body, format).await?;
    tracing::info!(tenant_id = %tenant.id, version, "playbook replaced");
    Ok((StatusCode::CREATED, Json(Uploaded { version })))
}
