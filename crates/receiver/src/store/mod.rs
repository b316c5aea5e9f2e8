//! Where received deliveries are remembered, so a redelivery is recognised and an event whose
//! handler never finished is handed over again.
//!
//! One row per delivery: a record id, the `webhook-id` and a digest of the envelope tuple (both
//! unique), the raw body, when it arrived, a handler lease, and when it was processed. The
//! database's own uniqueness check decides races between concurrent deliveries.

mod memory;
// `sql` first: its `sql_dedup_store!` macro is used by the backends declared after it.
#[macro_use]
mod sql;
mod postgres;
mod sqlite;

use std::fmt;

use async_trait::async_trait;
use sha2::{Digest as _, Sha256};
use uuid::Uuid;
use verdict_webhooks::Envelope;

use crate::ReceiveError;

pub use memory::MemoryDedupStore;
pub use postgres::PostgresDedupStore;
pub use sqlite::SqliteDedupStore;

/// The table the SQL stores create and use.
pub const TABLE: &str = "verdict_received_webhooks";

/// SHA-256 over the envelope's (tenant, event type, subject hash, timestamp).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TupleDigest(pub [u8; 32]);

impl TupleDigest {
    /// The digest of an envelope's dedup tuple.
    pub fn of(envelope: &Envelope) -> TupleDigest {
        let (tenant, event_type, subject_hash, timestamp) = envelope.dedup_tuple();
        let mut hasher = Sha256::new();
        // Length prefixes, so ("ab", "c") and ("a", "bc") cannot collide.
        for field in [tenant, event_type, subject_hash, timestamp] {
            hasher.update((field.len() as u64).to_be_bytes());
            hasher.update(field.as_bytes());
        }
        TupleDigest(hasher.finalize().into())
    }
}

impl fmt::Debug for TupleDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TupleDigest(")?;
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        write!(f, "..)")
    }
}

/// One delivery as a store keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct Record {
    /// The receiver's own id for this record (UUIDv7).
    pub id: Uuid,
    /// The `webhook-id` header; absent only for unsigned deliveries without one.
    pub webhook_id: Option<String>,
    /// Digest of the envelope's dedup tuple.
    pub tuple_digest: TupleDigest,
    /// The request body exactly as received.
    pub body: Vec<u8>,
    /// When it was received, unix milliseconds.
    pub received_at_ms: i64,
    /// Until when (unix ms) the handler that took it holds it; recovery waits for this.
    pub lease_until_ms: i64,
}

// Bodies are never printed: they may carry tenant metadata.
impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Record")
            .field("id", &self.id)
            .field("webhook_id", &self.webhook_id)
            .field("tuple_digest", &self.tuple_digest)
            .field("body_len", &self.body.len())
            .field("received_at_ms", &self.received_at_ms)
            .field("lease_until_ms", &self.lease_until_ms)
            .finish()
    }
}

/// What recording a delivery found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOutcome {
    /// First sight of this webhook-id and tuple: the record is stored; process it.
    Recorded,
    /// The webhook-id or the tuple is already held: answer 2xx and discard.
    Duplicate,
}

/// Storage for dedup records; every implementation must pass the same behaviour tests.
///
/// Rows count for deduplication while they were received at or after `horizon_start_ms`, or
/// while they are still unprocessed: a pending event is never pruned, since that would lose it.
#[async_trait]
pub trait DedupStore: Send + Sync + 'static {
    /// Stores `record` in one transaction unless its webhook-id or tuple digest is already held.
    async fn record(
        &self,
        record: &Record,
        horizon_start_ms: i64,
    ) -> Result<RecordOutcome, ReceiveError>;

    /// Marks a record processed, so recovery never hands it over again.
    async fn mark_processed(&self, id: Uuid, now_ms: i64) -> Result<(), ReceiveError>;

    /// Takes up to `limit` unprocessed records whose lease ended by `now_ms`, leasing them until `lease_until_ms`, oldest first.
    async fn lease_pending(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Record>, ReceiveError>;

    /// Deletes processed records received before `horizon_start_ms`; returns how many.
    async fn prune(&self, horizon_start_ms: i64) -> Result<u64, ReceiveError>;
}

// A shared store (one pool for several receivers, or a trait object) is a store too.
#[async_trait]
impl<S: DedupStore + ?Sized> DedupStore for std::sync::Arc<S> {
    async fn record(
        &self,
        record: &Record,
        horizon_start_ms: i64,
    ) -> Result<RecordOutcome, ReceiveError> {
        (**self).record(record, horizon_start_ms).await
    }

    async fn mark_processed(&self, id: Uuid, now_ms: i64) -> Result<(), ReceiveError> {
        (**self).mark_processed(id, now_ms).await
    }

    async fn lease_pending(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Record>, ReceiveError> {
        (**self).lease_pending(now_ms, lease_until_ms, limit).await
    }

    async fn prune(&self, horizon_start_ms: i64) -> Result<u64, ReceiveError> {
        (**self).prune(horizon_start_ms).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(tenant: &str, event_type: &str) -> Envelope {
        Envelope {
            event_id: "evt".into(),
            tenant: tenant.into(),
            event_type: event_type.into(),
            subject_hash: "ab".into(),
            timestamp: "2026-01-01T00:00:00Z".into(),
            decision: "allow".into(),
            actions: serde_json::Value::Null,
            metadata: serde_json::Value::Null,
            feed: "signals".into(),
        }
    }

    #[test]
    fn shifting_a_boundary_between_tuple_fields_changes_the_digest() {
        let a = TupleDigest::of(&envelope("ab", "c"));
        let b = TupleDigest::of(&envelope("a", "bc"));
        assert_ne!(a, b);
    }

    #[test]
    fn the_digest_ignores_fields_outside_the_tuple() {
        let a = envelope("t", "decision.sim_swap");
        let mut b = a.clone();
        b.event_id = "another".into();
        b.decision = "deny".into();
        assert_eq!(TupleDigest::of(&a), TupleDigest::of(&b));
    }
}
