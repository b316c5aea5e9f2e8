//! The API key behind a request, as an extractor for the read and admin endpoints.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use uuid::Uuid;

use crate::app::AppState;
use crate::app::error::{ApiError, AuthError};
use crate::domain::Feed;
use crate::rate_limit::RateLimits;
use crate::store::{KeyGrant, Scope, TenantRecord};

/// A live API key (`Authorization: Bearer <api key>`). Its tenant is reached only through
/// [`Authenticated::require`], which checks the scope and the tenant's rate limit, so every
/// handler states the scope it needs.
pub struct Authenticated {
    grant: KeyGrant,
    limits: Arc<RateLimits>,
}

impl Authenticated {
    /// The tenant, if the key's scope allows `needed` (403 otherwise) and the tenant is within
    /// its rate limit (429 otherwise).
    pub fn require(&self, needed: Scope) -> Result<&TenantRecord, ApiError> {
        admit(&self.grant, needed, &self.limits)
    }

    /// The key's id.
    pub fn key_id(&self) -> Uuid {
        self.grant.key_id
    }
}

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let api_key = bearer(&parts.headers).ok_or(AuthError::MissingApiKey)?;
        let grant = app
            .credentials
            .grant(api_key)
            .await?
            .ok_or(AuthError::InvalidApiKey)?;
        Ok(Self {
            grant,
            limits: app.rate_limits.clone(),
        })
    }
}

/// The scope check, then the tenant's rate limit: what a request passes after its key is
/// known and before it does anything.
pub fn admit<'g>(
    grant: &'g KeyGrant,
    needed: Scope,
    limits: &RateLimits,
) -> Result<&'g TenantRecord, ApiError> {
    require_scope(grant, needed)?;
    limits.admit(&grant.tenant)?;
    Ok(&grant.tenant)
}

/// The scope check for a feed, then the tenant's rate limit: a key made for `feed` passes;
/// a general `ingest` (or `admin`) key only if the tenant does not require signed signals,
/// since no feed can carry our signature (403 otherwise).
pub fn admit_feed<'g>(
    grant: &'g KeyGrant,
    feed: Feed,
    limits: &RateLimits,
) -> Result<&'g TenantRecord, ApiError> {
    match grant.feed {
        Some(made_for) if made_for == feed => {}
        Some(made_for) => return Err(ApiError::FeedKeyElsewhere(made_for)),
        None => {
            require_scope(grant, Scope::Ingest)?;
            if grant.tenant.inbound_signature_required {
                return Err(ApiError::FeedNeedsItsOwnKey(feed));
            }
        }
    }
    limits.admit(&grant.tenant)?;
    Ok(&grant.tenant)
}

/// 403 unless the key's scope allows `needed` (a key made for one feed allows nothing else).
pub fn require_scope(grant: &KeyGrant, needed: Scope) -> Result<(), ApiError> {
    if let Some(feed) = grant.feed {
        return Err(ApiError::FeedKeyElsewhere(feed));
    }
    if grant.scope.allows(needed) {
        Ok(())
    } else {
        Err(ApiError::InsufficientScope {
            needed,
            has: grant.scope,
        })
    }
}

/// The bearer token of an `Authorization` header.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|k| !k.is_empty())
}
