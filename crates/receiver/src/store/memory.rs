//! An in-process store for tests and single-process receivers that accept losing their memory
//! on restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use uuid::Uuid;

use super::{DedupStore, Record, RecordOutcome, TupleDigest};
use crate::ReceiveError;

/// Records held in memory; clones share them, so a "restarted" receiver can reuse one.
///
/// Everything is lost when the process exits, including events whose handler had not finished:
/// use [`SqliteDedupStore`](super::SqliteDedupStore) or
/// [`PostgresDedupStore`](super::PostgresDedupStore) when that matters.
#[derive(Clone, Default)]
pub struct MemoryDedupStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    rows: HashMap<Uuid, Row>,
    by_webhook_id: HashMap<String, Uuid>,
    by_tuple: HashMap<TupleDigest, Uuid>,
}

struct Row {
    record: Record,
    processed_at_ms: Option<i64>,
}

impl Row {
    fn expired(&self, horizon_start_ms: i64) -> bool {
        self.processed_at_ms.is_some() && self.record.received_at_ms < horizon_start_ms
    }
}

impl Inner {
    fn remove(&mut self, id: Uuid) {
        if let Some(row) = self.rows.remove(&id) {
            if let Some(webhook_id) = &row.record.webhook_id {
                self.by_webhook_id.remove(webhook_id);
            }
            self.by_tuple.remove(&row.record.tuple_digest);
        }
    }

    /// The row a key points at, unless it has expired (then it is dropped, as the SQL stores do).
    fn live(&mut self, id: Option<Uuid>, horizon_start_ms: i64) -> bool {
        let Some(id) = id else { return false };
        let expired = self
            .rows
            .get(&id)
            .is_none_or(|row| row.expired(horizon_start_ms));
        if expired {
            self.remove(id);
        }
        !expired
    }
}

impl MemoryDedupStore {
    /// An empty store.
    pub fn new() -> MemoryDedupStore {
        MemoryDedupStore::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, ReceiveError> {
        // A panic while holding the lock leaves the maps consistent (every mutation is a few
        // inserts or removes), but report it rather than guess.
        self.inner
            .lock()
            .map_err(|_| ReceiveError::store("memory dedup store lock poisoned"))
    }
}

#[async_trait]
impl DedupStore for MemoryDedupStore {
    async fn record(
        &self,
        record: &Record,
        horizon_start_ms: i64,
    ) -> Result<RecordOutcome, ReceiveError> {
        let mut inner = self.lock()?;
        let by_id = record
            .webhook_id
            .as_ref()
            .and_then(|w| inner.by_webhook_id.get(w).copied());
        let by_tuple = inner.by_tuple.get(&record.tuple_digest).copied();
        let id_held = inner.live(by_id, horizon_start_ms);
        let tuple_held = inner.live(by_tuple, horizon_start_ms);
        if id_held || tuple_held {
            return Ok(RecordOutcome::Duplicate);
        }
        if let Some(webhook_id) = &record.webhook_id {
            inner.by_webhook_id.insert(webhook_id.clone(), record.id);
        }
        inner.by_tuple.insert(record.tuple_digest, record.id);
        inner.rows.insert(
            record.id,
            Row {
                record: record.clone(),
                processed_at_ms: None,
            },
        );
        Ok(RecordOutcome::Recorded)
    }

    async fn mark_processed(&self, id: Uuid, now_ms: i64) -> Result<(), ReceiveError> {
        let mut inner = self.lock()?;
        if let Some(row) = inner.rows.get_mut(&id) {
            row.processed_at_ms.get_or_insert(now_ms);
        }
        Ok(())
    }

    async fn lease_pending(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Record>, ReceiveError> {
        let mut inner = self.lock()?;
        let mut due: Vec<&mut Row> = inner
            .rows
            .values_mut()
            .filter(|row| row.processed_at_ms.is_none() && row.record.lease_until_ms <= now_ms)
            .collect();
        due.sort_by_key(|row| row.record.received_at_ms);
        Ok(due
            .into_iter()
            .take(limit as usize)
            .map(|row| {
                row.record.lease_until_ms = lease_until_ms;
                row.record.clone()
            })
            .collect())
    }

    async fn prune(&self, horizon_start_ms: i64) -> Result<u64, ReceiveError> {
        let mut inner = self.lock()?;
        let expired: Vec<Uuid> = inner
            .rows
            .iter()
            .filter(|(_, row)| row.expired(horizon_start_ms))
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            inner.remove(*id);
        }
        Ok(expired.len() as u64)
    }
}
