//! Completed keys, kept in process: a completed row never changes until it expires, so a replay
//! (or a mismatch against it) can be answered with no database round trip. Rows in flight or
//! dispatched are never cached: they change.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use uuid::Uuid;

use crate::store::StoredResponse;

/// Entries kept; about 10 000 × a few hundred bytes.
pub const DEFAULT_CAPACITY: usize = 10_000;

type Key = (Uuid, Vec<u8>);

struct Entry {
    fingerprint: Vec<u8>,
    response: StoredResponse,
    expires_at: i64,
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

/// A bounded map of completed keys, oldest evicted first.
pub struct CompletedCache {
    capacity: usize,
    inner: Mutex<(HashMap<Key, Entry>, VecDeque<Key>)>,
}

impl CompletedCache {
    /// A cache holding at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    /// Looks a key up at `now`, honouring its expiry.
    pub fn get(&self, tenant: Uuid, digest: &[u8], fingerprint: &[u8], now: i64) -> Cached {
        let Ok(mut guard) = self.inner.lock() else {
            return Cached::Miss;
        };
        let key = (tenant, digest.to_vec());
        match guard.0.get(&key) {
            None => Cached::Miss,
            Some(e) if e.expires_at <= now => {
                guard.0.remove(&key);
                Cached::Miss
            }
            Some(e) if e.fingerprint == fingerprint => Cached::Replay(e.response.clone()),
            Some(_) => Cached::Mismatch,
        }
    }

    /// Remembers a completed key until `expires_at`.
    pub fn insert(
        &self,
        tenant: Uuid,
        digest: Vec<u8>,
        fingerprint: Vec<u8>,
        response: StoredResponse,
        expires_at: i64,
    ) {
        if self.capacity == 0 {
            return;
        }
        let Ok(mut guard) = self.inner.lock() else {
            return;
        };
        let (map, order) = &mut *guard;
        let key = (tenant, digest);
        if map.contains_key(&key) {
            return;
        }
        while map.len() >= self.capacity {
            match order.pop_front() {
                Some(oldest) => {
                    map.remove(&oldest);
                }
                None => break,
            }
        }
        order.push_back(key.clone());
        map.insert(
            key,
            Entry {
                fingerprint,
                response,
                expires_at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(n: u8) -> StoredResponse {
        StoredResponse {
            status: 200,
            body: vec![n],
        }
    }

    #[test]
    fn a_completed_key_replays_until_it_expires() {
        let cache = CompletedCache::new(10);
        let t = Uuid::nil();
        cache.insert(t, vec![1], vec![9], response(1), 1000);
        assert_eq!(cache.get(t, &[1], &[9], 999), Cached::Replay(response(1)));
        assert_eq!(cache.get(t, &[1], &[8], 999), Cached::Mismatch);
        assert_eq!(cache.get(t, &[1], &[9], 1000), Cached::Miss);
        assert_eq!(
            cache.get(Uuid::max(), &[1], &[9], 0),
            Cached::Miss,
            "keys are per tenant"
        );
    }

    #[test]
    fn the_oldest_entry_is_evicted_at_capacity() {
        let cache = CompletedCache::new(2);
        let t = Uuid::nil();
        for n in 0..3u8 {
            cache.insert(t, vec![n], vec![0], response(n), i64::MAX);
        }
        assert_eq!(cache.get(t, &[0], &[0], 0), Cached::Miss);
        assert_eq!(cache.get(t, &[2], &[0], 0), Cached::Replay(response(2)));
    }
}
