//! The callback's inline attempt: sent from the stored outbox row once the signal's commit is
//! in, waited for at most the deadline, and recorded through the group commit.

use std::sync::Arc;

use tracing::Instrument;

use super::Ingest;
use super::group_commit::GroupCommit;
use super::settle::{RELEASE_RETRY_MAX, RELEASE_RETRY_MIN};
use crate::clock::now_ms;
use crate::delivery::schedule::Trigger;
use crate::store::{AttemptRecord, DueDelivery, StoreError};

impl Ingest {
    /// The callback's inline attempt. It waits at most the deadline: an attempt still running
    /// then finishes (and records itself) in the background while the response goes out. The
    /// attempt keeps the request's span, so its log lines carry the request id.
    pub(super) async fn attempt_inline(&self, due: DueDelivery) {
        let due_id = due.id;
        let (deliverer, commits) = (self.deliverer.clone(), self.commits.clone());
        let deadline = deliverer.settings().deadline;
        let attempt = tokio::spawn(
            async move {
                // Recorded through the group commit: the record shares a commit with other
                // signals' work instead of costing one of its own.
                let (attempt, record) = deliverer.send(&due, Trigger::Inline, now_ms()).await?;
                match commits.record_attempt(record.clone()).await {
                    Ok(()) => crate::delivery::observe(&attempt),
                    // The database went away after the send: the record is retried in the
                    // background, and the response does not wait for it.
                    Err(err) if err.is_unreachable() => {
                        tokio::spawn(record_later(commits, attempt, record).in_current_span());
                    }
                    Err(err) => return Err(err),
                }
                Ok::<_, StoreError>(())
            }
            .instrument(tracing::info_span!("delivery", delivery_id = %due_id, trigger = "inline")),
        );
        match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(err))) => {
                // The delivery stays leased, then due: the worker retries it.
                tracing::warn!(error = ?err, "could not record the inline delivery attempt");
            }
            Ok(Err(err)) => tracing::error!(error = ?err, "the inline delivery attempt panicked"),
            Err(_) => tracing::info!(
                "inline delivery attempt passed its deadline; continuing in the background"
            ),
        }
    }
}

/// Records an inline attempt that the database was unreachable for, retrying for as long as
/// the lease reserves for bookkeeping after a send ([`crate::delivery::LEASE_MARGIN`]): an
/// attempt made just before an outage is recorded when the database returns, instead of its
/// delivery waiting out the lease and being sent again by the worker.
async fn record_later(
    commits: Arc<GroupCommit>,
    attempt: crate::delivery::attempt::Attempt,
    record: AttemptRecord,
) {
    let give_up = tokio::time::Instant::now() + crate::delivery::LEASE_MARGIN;
    let mut wait = RELEASE_RETRY_MIN;
    loop {
        tokio::time::sleep(wait).await;
        match commits.record_attempt(record.clone()).await {
            Ok(()) => return crate::delivery::observe(&attempt),
            Err(err) if err.is_transient() && tokio::time::Instant::now() + wait < give_up => {
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
            }
            Err(err) => {
                // The delivery stays leased, then due: the worker retries it.
                return tracing::warn!(error = ?err, "could not record the inline delivery attempt");
            }
        }
    }
}
