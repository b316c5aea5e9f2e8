//! Reading a request body under a size limit, before anything parses it.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};

use crate::app::error::ApiError;

/// A refused body up to this size is read and dropped before the 413 goes out: closing a
/// socket with unread bytes makes the kernel send a reset, which can destroy the 413 before
/// the client reads it. Larger bodies are not worth the bandwidth; their clients may see a reset.
const DRAIN_LIMIT: usize = 1024 * 1024;

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
    if let Some(declared) = declared.filter(|&n| n > limit as u64) {
        if declared <= DRAIN_LIMIT as u64 {
            // Bounded in size here and in time by the body timeout.
            let _ = axum::body::to_bytes(body, DRAIN_LIMIT).await;
        }
        return Err(ApiError::TooLarge(limit));
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        let mut cause = std::error::Error::source(&err);
        while let Some(inner) = cause {
            if inner.is::<http_body_util::LengthLimitError>() {
                return ApiError::TooLarge(limit);
            }
            if inner.is::<crate::app::body_deadline::BodyDeadlineExceeded>() {
                return ApiError::BodyTimeout;
            }
            cause = inner.source();
        }
        ApiError::UnreadableBody
    })
}
