//! Error types.

/// Errors handling secrets.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The secret string is not `whsec_<base64>` with a non-empty key; the reason never echoes the secret.
    #[error("invalid webhook secret: {0}")]
    InvalidSecret(&'static str),
}

/// Why a webhook request failed verification.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    /// A required header is absent, empty, or not valid UTF-8.
    #[error("missing or unreadable header `{0}`")]
    MissingHeader(&'static str),
    /// The timestamp header is not a canonical integer number of seconds.
    #[error("invalid webhook timestamp")]
    InvalidTimestamp,
    /// The timestamp is older than the tolerance allows.
    #[error("webhook timestamp too old")]
    TimestampTooOld,
    /// The timestamp is further in the future than the tolerance allows.
    #[error("webhook timestamp too new")]
    TimestampTooNew,
    /// The signature header carries more entries than [`crate::MAX_SIGNATURES`].
    #[error("too many webhook signatures")]
    TooManySignatures,
    /// No `v1` signature in the header matches any of the secrets.
    #[error("no matching webhook signature")]
    NoMatchingSignature,
}
