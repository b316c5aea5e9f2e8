//! `POST /v1/keys`, `GET /v1/keys` and `DELETE /v1/keys/{key_id}`: an admin key issues, lists
//! and revokes its tenant's API keys. Another tenant's key ids are 404.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::auth::Authenticated;
use super::events::rfc3339;
use super::extract::{Path, Query};
use crate::app::AppState;
use crate::app::error::ApiError;
use crate::domain::Feed;
use crate::problem::Problem;
use crate::store::{ApiKeyRecord, Scope};
use crate::tenant::{self, IssuedKey};

/// Body of `POST /v1/keys`: a key of a scope, or an `ingest` key for one feed alone.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum NewKey {
    /// An `ingest` key for one feed alone (a carrier's sink credential, a SET transmitter's
    /// key): it may post there and nothing else.
    Feed(NewFeedKey),
    /// A key of a scope.
    Scoped(NewScopedKey),
}

/// A key of a scope.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewScopedKey {
    /// What the key may do: `ingest` (send signals), `read` (the GET endpoints) or `admin`.
    scope: Scope,
}

/// An `ingest` key for one feed alone.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewFeedKey {
    /// Always `ingest`.
    scope: IngestScope,
    /// The feed: `camara` or `set`.
    feed: KeyFeed,
}

/// The scope of a key made for a feed.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum IngestScope {
    Ingest,
}

/// A feed a key can be made for.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KeyFeed {
    Camara,
    Set,
}

impl NewKey {
    /// The scope and feed asked for.
    fn parts(&self) -> (Scope, Option<Feed>) {
        match self {
            Self::Scoped(key) => (key.scope, None),
            Self::Feed(NewFeedKey {
                scope: IngestScope::Ingest,
                feed,
            }) => (
                Scope::Ingest,
                Some(match feed {
                    KeyFeed::Camara => Feed::Camara,
                    KeyFeed::Set => Feed::Set,
                }),
            ),
        }
    }
}

/// `POST /v1/keys`: a new key, shown this once.
#[utoipa::path(post, path = "/v1/keys", operation_id = "create_key", tag = "keys",
    request_body(content = NewKey, content_type = "application/json"),
    responses((status = 201, body = IssuedKey, description = "Created; the key is shown this once"),
        (status = 400, body = Problem, description = "Invalid request"),
        (status = 422, body = Problem, description = "The tenant has 100 live keys (`quota-exceeded`)")))]
pub async fn create(
    State(app): State<AppState>,
    auth: Authenticated,
    body: Bytes,
) -> Result<(StatusCode, Json<IssuedKey>), ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let asked: NewKey = serde_json::from_slice(&body).map_err(|_| {
        ApiError::Invalid(
            "the body must be {\"scope\": \"ingest\"|\"read\"|\"admin\"}, or \
             {\"scope\": \"ingest\", \"feed\": \"camara\"|\"set\"} for a key of one feed alone"
                .into(),
        )
    })?;
    let (scope, feed) = asked.parts();
    let issued = tenant::issue_key(&*app.store, tenant.id, scope, feed).await?;
    tracing::info!(tenant_id = %tenant.id, key_id = %issued.key_id, %scope, "API key issued");
    Ok((StatusCode::CREATED, Json(issued)))
}

/// An API key as listed: never the key itself.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    pub key_id: Uuid,
    pub scope: Scope,
    /// The one feed the key may post to, if it is made for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub feed: Option<Feed>,
    pub created_at: String,
    /// To within a minute.
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
}

impl From<ApiKeyRecord> for KeyView {
    fn from(k: ApiKeyRecord) -> Self {
        Self {
            key_id: k.id,
            scope: k.scope,
            feed: k.feed,
            created_at: rfc3339(k.created_at),
            last_used_at: k.last_used_at.map(rfc3339),
            revoked_at: k.revoked_at.map(rfc3339),
        }
    }
}

/// Query of `GET /v1/keys`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Page size, 1 to 500 (default 50); a value outside is brought within.
    limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    after: Option<Uuid>,
}

/// A page of the tenant's keys, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KeyList {
    data: Vec<KeyView>,
    /// Where the next page starts (`after`); `null` on the last page.
    next_cursor: Option<Uuid>,
}

/// `GET /v1/keys`: the tenant's keys, revoked ones included, a page at a time.
#[utoipa::path(get, path = "/v1/keys", operation_id = "list_keys", tag = "keys", params(ListQuery),
    responses((status = 200, body = KeyList, description = "OK"),
        (status = 400, body = Problem, description = "Invalid request")))]
pub async fn list(
    State(app): State<AppState>,
    auth: Authenticated,
    Query(q): Query<ListQuery>,
) -> Result<Json<KeyList>, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let limit = q.limit.unwrap_or(50).clamp(1, tenant::MAX_KEYS_PAGE);
    let keys = tenant::list_keys(&*app.store, tenant.id, q.after, limit).await?;
    let next_cursor = (keys.len() as i64 == limit)
        .then(|| keys.last().map(|k| k.id))
        .flatten();
    Ok(Json(KeyList {
        data: keys.into_iter().map(KeyView::from).collect(),
        next_cursor,
    }))
}

/// `DELETE /v1/keys/{key_id}`: revokes a key at once on this instance and within 5 s on every
/// other. Revoking a revoked key is a no-op.
#[utoipa::path(delete, path = "/v1/keys/{key_id}", operation_id = "revoke_key", tag = "keys",
    params(("key_id" = Uuid, Path, description = "The key's id")),
    responses((status = 204, description = "Revoked"), (status = 404, body = Problem, description = "Not found")))]
pub async fn revoke(
    State(app): State<AppState>,
    auth: Authenticated,
    Path(key_id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = auth.require(Scope::Admin)?;
    let key_id = Uuid::parse_str(&key_id).map_err(|_| ApiError::NotFound)?;
    tenant::revoke_key(&*app.store, tenant.id, key_id).await?;
    app.credentials.forget_key(key_id);
    tracing::info!(tenant_id = %tenant.id, %key_id, by_key = %auth.key_id(), "API key revoked");
    Ok(StatusCode::NO_CONTENT)
}
