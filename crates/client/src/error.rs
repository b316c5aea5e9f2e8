//! The crate's one error type.

use serde_json::Value;

/// Why a signal was not accepted.
///
/// Messages never contain the API key, the signing secret or the signal body.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The builder was given something unusable.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// The signal could not be serialised as JSON.
    #[error("the signal is not serialisable as JSON: {0}")]
    Serialize(serde_json::Error),
    /// An idempotency key given to resend is not 1 to 255 visible ASCII characters.
    #[error("invalid idempotency key: it must be 1 to 255 visible ASCII characters")]
    InvalidKey,
    /// 422: verdict already holds this key for a different body.
    #[error(
        "the idempotency key was reused with a different body (422): a key-generation bug; \
         every signal needs a fresh random key, and a retry must resend the same bytes"
    )]
    KeyReusedWithDifferentBody {
        /// The key the request carried.
        idempotency_key: String,
        /// The problem document verdict answered with.
        problem: Value,
    },
    /// A 4xx other than 409 and 422 (and 429): the request is wrong and retrying will not help.
    #[error("verdict rejected the signal with status {status}{}", title(problem))]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The problem document verdict answered with (`application/problem+json`).
        problem: Value,
    },
    /// Every attempt got a retryable status (5xx, 409, 429); resend later with the same key.
    #[error(
        "verdict was unavailable: status {status} after {attempts} attempts{}",
        title(problem)
    )]
    Unavailable {
        /// The last attempt's status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The key every attempt carried; pass it to `resend_signal_bytes` with the same bytes.
        idempotency_key: String,
        /// The last problem document.
        problem: Value,
    },
    /// Every attempt failed in transport (no connection, no response, timeout); resend later with the same key.
    #[error("could not reach verdict after {attempts} attempts: {error}")]
    Network {
        /// Attempts made.
        attempts: u32,
        /// The key every attempt carried; pass it to `resend_signal_bytes` with the same bytes.
        idempotency_key: String,
        /// The last attempt's transport error.
        error: reqwest::Error,
    },
}

/// `: <title>: <detail>` from the problem document, each part where it has one: the detail
/// is what says which field or header was wrong.
fn title(problem: &Value) -> String {
    ["title", "detail"]
        .into_iter()
        .filter_map(|field| problem.get(field).and_then(Value::as_str))
        .map(|part| format!(": {part}"))
        .collect()
}
