//! The crate's one error type.

use verdict_webhooks::VerifyError;

/// A boxed error from a handler or a store implementation; most error types convert into it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a delivery was refused, or why the receiver could not do its part.
///
/// Messages never contain a secret or any part of a request body.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    /// The signature is missing, malformed or made with another secret.
    #[error("unauthenticated webhook: {0}")]
    Unauthenticated(VerifyError),
    /// The body is larger than the configured limit; refused before anything else is checked.
    #[error("webhook body larger than {limit} bytes")]
    TooLarge {
        /// The limit in force, in bytes.
        limit: usize,
    },
    /// The timestamp is outside the tolerance: refused as a possible replay, whatever its id.
    #[error("stale webhook refused as a possible replay: {0}")]
    Stale(VerifyError),
    /// The verified body is not a verdict envelope.
    // Position only: serde_json's messages can quote values from the body.
    #[error("body is not a verdict envelope (line {line}, column {column})")]
    NotAnEnvelope {
        /// Line of the first error in the body.
        line: usize,
        /// Column of the first error in the body.
        column: usize,
    },
    /// The dedup store could not be reached or failed; the delivery should be retried.
    #[error("dedup store unavailable: {0}")]
    Store(BoxError),
    /// The integrator's handler returned an error; the event stays pending for recovery.
    #[error("webhook handler failed: {0}")]
    Handler(BoxError),
    /// The receiver was configured in a way that would be unsafe.
    #[error("invalid receiver configuration: {0}")]
    Config(&'static str),
}

impl ReceiveError {
    /// Wraps a store implementation's failure.
    pub fn store(err: impl Into<BoxError>) -> ReceiveError {
        ReceiveError::Store(err.into())
    }

    /// Maps a verification failure: staleness is a replay, everything else is authentication.
    pub(crate) fn from_verify(err: VerifyError) -> ReceiveError {
        match err {
            VerifyError::TimestampTooOld | VerifyError::TimestampTooNew => ReceiveError::Stale(err),
            other => ReceiveError::Unauthenticated(other),
        }
    }

    /// Keeps only the position of a parse error.
    pub(crate) fn not_an_envelope(err: &serde_json::Error) -> ReceiveError {
        ReceiveError::NotAnEnvelope {
            line: err.line(),
            column: err.column(),
        }
    }
}

impl From<sqlx::Error> for ReceiveError {
    fn from(err: sqlx::Error) -> ReceiveError {
        ReceiveError::Store(Box::new(err))
    }
}
