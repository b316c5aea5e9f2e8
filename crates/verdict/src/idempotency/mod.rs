//! The `Idempotency-Key` contract: the key itself, the payload fingerprint, and what a claim on
//! a key can find.

mod completed_cache;
mod fingerprint;
mod key;

pub use completed_cache::{Cached, CompletedCache, DEFAULT_CAPACITY_BYTES, Payload, Replay};
pub use fingerprint::{Fingerprint, FingerprintError};
pub use key::{IdempotencyKey, KeyError};

/// The endpoint part of the key table's primary key: keys are scoped per tenant and endpoint.
pub const SIGNALS_ENDPOINT: &str = crate::domain::Feed::Signals.endpoint();
