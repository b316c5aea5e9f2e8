//! The API key behind a request, as an extractor for the read and admin endpoints.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, AuthError};
use crate::store::{KeyGrant, Scope, TenantRecord};

/// A live API key (`Authorization: Bearer <api key>`). Its tenant is reached only through
/// [`Authenticated::require`], which checks the scope, so every handler states the scope it
/// needs.
pub struct Authenticated {
    grant: KeyGrant,
}

impl Authenticated {
    /// The tenant, if the key's scope allows `needed` (403 otherwise).
    pub fn require(&self, needed: Scope) -> Result<&TenantRecord, ApiError> {
        require_scope(&self.grant, needed)?;
        Ok(&self.grant.tenant)
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
        Ok(Self { grant })
    }
}

/// 403 unless the key's scope allows `needed`.
pub fn require_scope(grant: &KeyGrant, needed: Scope) -> Result<(), ApiError> {
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
