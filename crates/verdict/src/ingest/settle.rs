//! What a request that holds a key does after a failure: release the lock so a retry resumes
//! at once, or store a final error that every retry replays.

use tracing::Instrument;

use super::{Ingest, IngestError};
use crate::clock::now_ms;
use crate::store::{HeldKey, StoreError, StoredResponse};

impl Ingest {
    /// After a failure with the key held: a transient one releases the lock so the retry
    /// resumes from the recovery point; a final one is stored and replayed. A lost lock is
    /// not ours to touch.
    pub(super) async fn settle_failure(&self, err: &IngestError, held: &HeldKey) {
        match err {
            IngestError::Unavailable(StoreError::LockLost) => {}
            IngestError::Unavailable(_) | IngestError::InProgress | IngestError::KeyReused => {
                self.release_soon(held).await;
            }
            IngestError::Store(cause) => {
                tracing::error!(error = ?cause, "signal failed permanently; storing the 500");
                let response = StoredResponse {
                    status: 500,
                    body: crate::problem::Problem::internal().to_json(),
                };
                if let Err(store) = self
                    .store
                    .complete_failed(&held.key, held.lock_token, &response)
                    .await
                {
                    tracing::warn!(error = ?store, "could not store a final error");
                }
            }
        }
    }

    /// Releases a held lock so that the client's retry resumes at once. The failure that
    /// brought us here is often the database going away, and the 503 must not wait out the
    /// outage: the release gets [`RELEASE_INLINE`] (a reachable database answers in
    /// milliseconds, so a retry sent at once finds the lock released), then goes on in the
    /// background, retried while the database stays unreachable, until it answers or the lock
    /// expires anyway (then a retry takes the key over).
    async fn release_soon(&self, held: &HeldKey) {
        let (store, held) = (self.store.clone(), held.clone());
        let give_up_at = now_ms().saturating_add(self.settings.lock_timeout_ms);
        let release = async move {
            let mut wait = RELEASE_RETRY_MIN;
            loop {
                match store.release(&held.key, held.lock_token).await {
                    Ok(()) => return,
                    Err(err) if err.is_transient() && now_ms() < give_up_at => {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RELEASE_RETRY_MAX);
                    }
                    Err(err) => {
                        tracing::warn!(
                            error = ?err,
                            "could not release an idempotency lock; it expires with its timeout"
                        );
                        return;
                    }
                }
            }
        };
        let releasing = tokio::spawn(release.in_current_span());
        let _ = tokio::time::timeout(RELEASE_INLINE, releasing).await;
    }
}

/// How long a failed request waits for its lock's release before answering; the release goes
/// on in the background after that.
const RELEASE_INLINE: std::time::Duration = std::time::Duration::from_millis(250);

/// The first wait before a failed lock release (or attempt record) is tried again; it doubles
/// up to [`RELEASE_RETRY_MAX`].
pub(super) const RELEASE_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(100);
pub(super) const RELEASE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);
