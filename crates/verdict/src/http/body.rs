//! Reading a request body under a size limit, before anything parses it.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};

use super::error::ApiError;

/// Reads `body`, refusing it (413) as soon as it is known to be larger than `limit`: from
/// `Content-Length` before reading, or while reading a body that did not declare its length.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let mut cause = std::error::Error::source(&err);
        while let Some(inner) = cause {
            if inner.is::<http_body_util::LengthLimitError>() {
                return ApiError::TooLarge(limit);
            }
            if inner.is::<tower_http::timeout::TimeoutError>() {
                return ApiError::BodyTimeout;
            }
            cause = inner.source();
        }
        ApiError::UnreadableBody
    })
}
