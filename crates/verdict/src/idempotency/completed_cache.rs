//! Completed keys, kept in process: a completed row never changes until it expires, so a replay
//! (or a mismatch against it) can be answered with no database round trip. Rows in flight are
//! never cached: they change.
//!
//! Bounded by bytes (a weigher over each entry's size), and each entry expires when its row
//! does: the expiry comes from the stored row, never from the request that cached it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use moka::Expiry;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::store::StoredResponse;

/// Bytes kept by default.
pub const DEFAULT_CAPACITY_BYTES: u64 = 64 * 1024 * 1024;

/// What an entry costs beyond its byte fields: the key, the `Arc`, the map's own bookkeeping.
const ENTRY_OVERHEAD_BYTES: usize = 128;

type Key = (Uuid, Vec<u8>);

struct Entry {
    fingerprint: Vec<u8>,
    /// SHA-256 of the raw bytes of a request that completed or replayed the key: a retry with
    /// the very same bytes is the same valid payload, so it replays with no parsing at all.
    raw_body: [u8; 32],
    status: u16,
    /// The stored response body: a replay hands out a reference to it, not a copy.
    body: Bytes,
    /// The row's own expiry (unix ms).
    expires_at: i64,
}

/// A request's payload, as the cache compares it.
pub struct Payload {
    /// SHA-256 over the canonical JSON.
    pub fingerprint: Vec<u8>,
    /// SHA-256 over the raw bytes.
    pub raw_body: [u8; 32],
}

/// A completed key's response as a replay of the very same bytes sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replay {
    pub status: u16,
    pub body: Bytes,
}

/// What the cache knows about a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Cached {
    /// Completed with this payload: replay.
    Replay(StoredResponse),
    /// Completed with another payload: 422.
    Mismatch,
    /// Not known here: ask the database.
    Miss,
}

/// Expires each entry at its row's `expires_at`.
struct AtRowExpiry;

impl Expiry<Key, Arc<Entry>> for AtRowExpiry {
    fn expire_after_create(&self, _: &Key, entry: &Arc<Entry>, _: Instant) -> Option<Duration> {
        let left = entry.expires_at.saturating_sub(now_ms()).max(0);
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }
}

/// A concurrent cache of completed keys, bounded in bytes.
pub struct CompletedCache {
    entries: moka::sync::Cache<Key, Arc<Entry>>,
}

impl CompletedCache {
    /// A cache holding at most about `capacity_bytes` of keys and responses.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            entries: moka::sync::Cache::builder()
                .max_capacity(capacity_bytes)
                .weigher(|key: &Key, entry: &Arc<Entry>| {
                    let bytes = key.1.len()
                        + entry.fingerprint.len()
                        + entry.body.len()
                        + ENTRY_OVERHEAD_BYTES;
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .expire_after(AtRowExpiry)
                .build(),
        }
    }

    /// Looks a key up at `now`, honouring the row's expiry to the millisecond.
    pub fn get(&self, tenant: Uuid, digest: &[u8], fingerprint: &[u8], now: i64) -> Cached {
        let key = (tenant, digest.to_vec());
        match self.entries.get(&key) {
            None => Cached::Miss,
            Some(e) if e.expires_at <= now => {
                self.entries.invalidate(&key);
                Cached::Miss
            }
            Some(e) if e.fingerprint == fingerprint => Cached::Replay(StoredResponse {
                status: e.status,
                body: e.body.to_vec(),
            }),
            Some(_) => Cached::Mismatch,
        }
    }

    /// The stored response of a completed key whose request had exactly these bytes.
    pub fn get_by_raw_body(
        &self,
        tenant: Uuid,
        digest: &[u8],
        raw_body: &[u8; 32],
        now: i64,
    ) -> Option<Replay> {
        self.entries
            .get(&(tenant, digest.to_vec()))
            .filter(|e| e.expires_at > now && &e.raw_body == raw_body)
            .map(|e| Replay {
                status: e.status,
                body: e.body.clone(),
            })
    }

    /// Remembers a completed key until the row's `expires_at`.
    pub fn insert(
        &self,
        key: (Uuid, Vec<u8>),
        payload: Payload,
        response: StoredResponse,
        expires_at: i64,
    ) {
        self.entries.insert(
            key,
            Arc::new(Entry {
                fingerprint: payload.fingerprint,
                raw_body: payload.raw_body,
                status: response.status,
                body: Bytes::from(response.body),
                expires_at,
            }),
        );
    }

    /// Bytes held now (after pending maintenance), for tests and metrics.
    pub fn weighted_size(&self) -> u64 {
        self.entries.run_pending_tasks();
        self.entries.weighted_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(n: u8) -> Payload {
        Payload {
            fingerprint: vec![n],
            raw_body: [n; 32],
        }
    }

    fn response(n: u8, len: usize) -> StoredResponse {
        StoredResponse {
            status: 200,
            body: vec![n; len],
        }
    }

    #[test]
    fn a_completed_key_replays_until_its_row_expires() {
        let cache = CompletedCache::new(1 << 20);
        let t = Uuid::nil();
        let expires_at = now_ms() + 60_000;
        cache.insert((t, vec![1]), payload(9), response(1, 1), expires_at);
        let before = expires_at - 1;
        assert_eq!(
            cache.get(t, &[1], &[9], before),
            Cached::Replay(response(1, 1))
        );
        assert_eq!(cache.get(t, &[1], &[8], before), Cached::Mismatch);
        assert_eq!(
            cache.get_by_raw_body(t, &[1], &[9; 32], before),
            Some(Replay {
                status: 200,
                body: Bytes::from(vec![1; 1])
            }),
            "the same bytes replay without parsing"
        );
        assert_eq!(cache.get_by_raw_body(t, &[1], &[8; 32], before), None);
        assert_eq!(cache.get(t, &[1], &[9], expires_at), Cached::Miss);
        assert_eq!(
            cache.get(Uuid::max(), &[1], &[9], 0),
            Cached::Miss,
            "keys are per tenant"
        );
    }

    #[test]
    fn an_entry_whose_row_already_expired_is_gone_at_once() {
        let cache = CompletedCache::new(1 << 20);
        cache.insert(
            (Uuid::nil(), vec![1]),
            payload(9),
            response(1, 1),
            now_ms() - 1,
        );
        assert!(!cache.entries.contains_key(&(Uuid::nil(), vec![1])));
    }

    #[test]
    fn the_cache_stays_within_its_byte_bound_however_many_keys_are_reused() {
        let capacity = 64 * 1024;
        let cache = CompletedCache::new(capacity);
        let t = Uuid::nil();
        // Reusing the same keys after "expiry" and many distinct keys: neither grows it.
        for round in 0..20u8 {
            for n in 0..200u16 {
                let key = n.to_be_bytes().to_vec();
                cache.insert(
                    (t, key),
                    payload(round),
                    response(1, 1024),
                    now_ms() + 60_000,
                );
            }
        }
        assert!(
            cache.weighted_size() <= capacity,
            "{} bytes held, bound {capacity}",
            cache.weighted_size()
        );
    }
}
