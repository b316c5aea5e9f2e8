//! The tenant behind an API key, as an extractor for the read and admin endpoints.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use super::AppState;
use super::error::{ApiError, AuthError};
use crate::store::TenantRecord;

/// The authenticated tenant (`Authorization: Bearer <api key>`).
pub struct Authenticated(pub TenantRecord);

impl FromRequestParts<AppState> for Authenticated {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, ApiError> {
        let api_key = bearer(&parts.headers).ok_or(AuthError::MissingApiKey)?;
        let tenant = app
            .credentials
            .tenant(api_key)
            .await?
            .ok_or(AuthError::InvalidApiKey)?;
        Ok(Self(tenant))
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
