//! RFC 9457 problem details: every error the API returns, each with a stable `type` URI.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Base of the stable problem type URIs.
const TYPE_BASE: &str = "https://verdict.dev/problems/";

/// A problem+json body with its status and any extra headers.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: &'static str,
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(skip)]
    #[schema(ignore)]
    retry_after: Option<u32>,
    #[serde(skip)]
    #[schema(ignore)]
    www_authenticate: bool,
}

impl Problem {
    /// A problem of the given slug, title and status.
    pub fn new(slug: &str, title: &'static str, status: StatusCode) -> Self {
        Self {
            type_uri: format!("{TYPE_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: None,
            retry_after: None,
            www_authenticate: false,
        }
    }

    /// Adds a human-readable explanation specific to this occurrence.
    pub fn detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Adds `Retry-After` (seconds).
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// 400: the request is malformed.
    pub fn invalid_request(detail: impl Into<String>) -> Self {
        Self::new(
            "invalid-request",
            "The request is invalid",
            StatusCode::BAD_REQUEST,
        )
        .detail(detail)
    }

    /// 400: the Idempotency-Key header is malformed.
    pub fn invalid_idempotency_key(detail: impl Into<String>) -> Self {
        Self::new(
            "invalid-idempotency-key",
            "The Idempotency-Key header is invalid",
            StatusCode::BAD_REQUEST,
        )
        .detail(detail)
    }

    /// 401: no valid credentials.
    pub fn unauthorized(slug: &str, detail: impl Into<String>) -> Self {
        let mut p =
            Self::new(slug, "Authentication failed", StatusCode::UNAUTHORIZED).detail(detail);
        p.www_authenticate = slug == "invalid-api-key";
        p
    }

    /// 404.
    pub fn not_found() -> Self {
        Self::new("not-found", "Not found", StatusCode::NOT_FOUND)
    }

    /// 405: the path exists, the method does not (the router adds `Allow`).
    pub fn method_not_allowed() -> Self {
        Self::new(
            "method-not-allowed",
            "Method not allowed",
            StatusCode::METHOD_NOT_ALLOWED,
        )
    }

    /// 500: a final failure, stored on the key and replayed.
    pub fn internal() -> Self {
        Self::new(
            "internal-error",
            "The signal could not be processed",
            StatusCode::INTERNAL_SERVER_ERROR,
        )
    }

    /// 503: a transient failure; retrying with the same key resumes the work.
    pub fn unavailable() -> Self {
        Self::new(
            "temporarily-unavailable",
            "The service is temporarily unavailable",
            StatusCode::SERVICE_UNAVAILABLE,
        )
        .detail("Retry with the same Idempotency-Key to resume where this request stopped.")
        .retry_after(2)
    }

    /// The body as bytes, for storing on a key.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem serialises")
    }
}

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            self.to_json(),
        )
            .into_response();
        let headers = response.headers_mut();
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.www_authenticate {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"verdict\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 500 a final failure stores on its key is replayed byte for byte, to every retry
    /// and across versions: its bytes must not change.
    #[test]
    fn the_stored_internal_error_keeps_its_bytes() {
        assert_eq!(
            Problem::internal().to_json(),
            br#"{"type":"https://verdict.dev/problems/internal-error","title":"The signal could not be processed","status":500}"#
        );
    }
}
