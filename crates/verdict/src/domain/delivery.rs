//! Where a delivery stands, and the state the store records after an attempt.

use std::fmt;
use std::str::FromStr;

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Waiting for an attempt (the inline one, or a retry when `next_attempt_at` comes).
    Pending,
    /// A 2xx was received.
    Succeeded,
    /// Terminal: a 4xx other than 429, a redirect, a refused destination or no URL.
    Failed,
    /// Retryable failures until the retries ran out.
    Dead,
    /// An at-most-once connector's call ended ambiguously (no answer, a timeout): it may or
    /// may not have acted, and is not retried; an operator resolves it.
    Unknown,
    /// A callback decided while the tenant's endpoint was disabled (after a 410): stored with
    /// its bytes, never attempted, and due again when the endpoint is re-enabled.
    Suspended,
}

impl DeliveryStatus {
    /// Every status, in the order the API lists them.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Succeeded,
        Self::Failed,
        Self::Dead,
        Self::Unknown,
        Self::Suspended,
    ];

    /// The stored (and shown) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Unknown => "unknown",
            Self::Suspended => "suspended",
        }
    }
}

impl DeliveryStatus {
    /// Whether no attempt will follow unless someone redelivers it (a suspended one waits for
    /// its endpoint to be re-enabled).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Pending | Self::Suspended)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a delivery status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a delivery status (expected pending, succeeded, failed, dead, unknown or \
     suspended)"
)]
pub struct UnknownStatus(pub String);

/// Decodes the stored name (for `sqlx::FromRow`).
impl TryFrom<String> for DeliveryStatus {
    type Error = <DeliveryStatus as FromStr>::Err;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl FromStr for DeliveryStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// What re-enabling a tenant's callback endpoint does with the callbacks suspended while it
/// was disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuspendedCallbacks {
    /// Make them due now: each is sent once, with its stored bytes and `webhook-id`.
    Resume,
    /// Leave them suspended (an operator redelivers the ones wanted; retention prunes the rest).
    Leave,
}

/// The delivery's state after an attempt: what the store records with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    pub status: DeliveryStatus,
    pub retries_left: i64,
    pub next_attempt_at: i64,
    pub disable_endpoint: bool,
}
