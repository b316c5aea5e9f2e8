//! An operator settles what no sender can: an at-most-once connector's request whose outcome is
//! `unknown` (it may or may not have acted) is resolved `done` or `failed` by someone who asked
//! the tenant's system. Recorded as an attempt (trigger `resolve`) with the key that resolved it
//! and why; nothing is called. Only an `unknown` request can be resolved.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::now_ms;
use crate::domain::{DeliveryStatus, InvalidReason, Reason};
use crate::store::{DeliveryRecord, Resolution, Resolved, StoreError};

use super::DeliveryPort;

/// What an operator found the request did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Settled {
    /// It acted: the request `succeeded`.
    Done,
    /// It did not: the request `failed`.
    Failed,
}

impl Settled {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    fn status(self) -> DeliveryStatus {
        match self {
            Self::Done => DeliveryStatus::Succeeded,
            Self::Failed => DeliveryStatus::Failed,
        }
    }
}

impl std::str::FromStr for Settled {
    type Err = UnknownSettled;

    fn from_str(s: &str) -> Result<Self, UnknownSettled> {
        match s {
            "done" => Ok(Self::Done),
            "failed" => Ok(Self::Failed),
            _ => Err(UnknownSettled),
        }
    }
}

/// An outcome that is neither `done` nor `failed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`outcome` must be `done` or `failed`")]
pub struct UnknownSettled;

/// The body of `POST /v1/deliveries/{id}/resolve`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resolve {
    pub outcome: Settled,
    /// Why, for the record: 1 to 500 characters, not all blank.
    #[schema(
        min_length = 1,
        max_length = 500,
        pattern = r"^[^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*[^\s\u0000-\u001F\u007F-\u009F][^\u0000-\u0008\u000B-\u001F\u007F-\u009F]*$"
    )]
    pub reason: String,
}

/// Why a resolution was refused.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Reason(#[from] InvalidReason),
    #[error("no such delivery")]
    NotFound,
    /// Only an action request whose outcome is `unknown` is an operator's to settle.
    #[error("only an action request whose outcome is unknown can be resolved; this one is {0}")]
    NotUnknown(DeliveryStatus),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Resolves one of the tenant's action requests whose outcome is `unknown` to `settled`, as
/// the API key `by` (the nil key for the CLI) says, for `reason`; returns the request as it now
/// stands. The event's action outcome reads it from there.
pub async fn resolve(
    store: &dyn DeliveryPort,
    tenant_id: Uuid,
    delivery_id: Uuid,
    settled: Settled,
    reason: &str,
    by: Uuid,
) -> Result<DeliveryRecord, ResolveError> {
    let reason = Reason::parse(reason)?;
    let resolution = Resolution {
        tenant_id,
        delivery_id,
        status: settled.status(),
        last_error: (settled == Settled::Failed)
            .then(|| format!("resolved failed by an operator: {}", reason.as_str())),
        attempt_id: Uuid::now_v7(),
        resolved_by: by,
        reason: reason.as_str().to_owned(),
        now: now_ms(),
    };
    match store.resolve(&resolution).await? {
        Resolved::Settled(record) => {
            metrics::counter!("verdict_deliveries_resolved_total", "outcome" => settled.as_str())
                .increment(1);
            tracing::info!(%tenant_id, %delivery_id, outcome = settled.as_str(), by_key = %by,
                "an operator resolved an unknown outcome");
            Ok(*record)
        }
        Resolved::NotUnknown(status) => Err(ResolveError::NotUnknown(status)),
        Resolved::NotFound => Err(ResolveError::NotFound),
    }
}
