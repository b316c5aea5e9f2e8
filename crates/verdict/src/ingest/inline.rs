//! The callback's inline attempt: sent from the stored outbox row once the signal's commit is
//! in, waited for at most the deadline, and recorded through the group commit after the
//! response has gone out.

use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::Instrument;

use super::Ingest;
use super::group_commit::GroupCommit;
use super::phases::{self, Phase};
use super::settle::{RELEASE_RETRY_MAX, RELEASE_RETRY_MIN};
use crate::clock::now_ms;
use crate::delivery::schedule::Trigger;
use crate::store::{AttemptRecord, DueDelivery, StoreError};

impl Ingest {
    /// The callbacks' inline attempts, one per endpoint, sent at once. The response waits for
    /// the sends, at most the deadline (an attempt still running then finishes in the
    /// background), but not for their records: each record joins a later group commit, so a
    /// request waits for two commits, not three. Until it is in, a delivery stays leased (its
    /// lease covers the deadline and the bookkeeping after it), so no worker sends it again
    /// meanwhile; a crash before it lands leaves the delivery to the worker once the lease runs
    /// out, which sends it again with the same `webhook-id` and bytes. The attempts keep the
    /// request's span, so their log lines carry the request id.
    ///
    /// A record is retried after transient failures only while the delivery's lease
    /// (`leased_until`, unix ms) has [`RECORD_BEFORE_LEASE_ENDS_MS`] to run: a record landing
    /// after the lease could overwrite the state a worker's own attempt of it gave it.
    pub(super) async fn attempt_callbacks(&self, inline: Vec<(DueDelivery, i64)>) {
        if inline.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.deliverer.settings().deadline;
        let sends: Vec<_> = inline
            .into_iter()
            .map(|(due, leased_until)| self.start_inline(due, leased_until))
            .collect();
        phases::timed(Phase::Inline, async {
            for was_sent in sends {
                match tokio::time::timeout_at(deadline, was_sent).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => tracing::error!("an inline delivery attempt panicked"),
                    Err(_) => tracing::info!(
                        "inline delivery attempt passed its deadline; continuing in the background"
                    ),
                }
            }
        })
        .await;
    }

    /// Starts one callback's inline attempt in the background; the receiver answers once it
    /// was sent (or failed to be).
    fn start_inline(&self, due: DueDelivery, leased_until: i64) -> oneshot::Receiver<()> {
        let due_id = due.id;
        let (deliverer, commits) = (self.deliverer.clone(), self.commits.clone());
        let (sent, was_sent) = oneshot::channel();
        self.background.spawn(
            async move {
                let outcome = deliverer.send(&due, Trigger::Inline, now_ms()).await;
                let _ = sent.send(());
                match outcome {
                    Ok((attempt, record)) => {
                        record_attempt(commits, attempt, record, leased_until).await;
                    }
                    // The delivery stays leased, then due: the worker retries it.
                    Err(err) => {
                        tracing::warn!(error = ?err, "could not make the inline delivery attempt");
                    }
                }
            }
            .instrument(tracing::info_span!("delivery", delivery_id = %due_id, trigger = "inline")),
        );
        was_sent
    }
}

/// Records an inline attempt. One that met a transient failure (the database unreachable, a
/// deadlock) is retried while the delivery's lease has [`RECORD_BEFORE_LEASE_ENDS_MS`] to run: an
/// attempt made just before an outage is recorded when the database returns, instead of its
/// delivery waiting out the lease and being sent again by the worker, and no record lands after
/// the lease, when a worker may have leased and sent the delivery itself.
pub(super) async fn record_attempt(
    commits: Arc<GroupCommit>,
    attempt: crate::delivery::attempt::Attempt,
    record: AttemptRecord,
    leased_until: i64,
) {
    let give_up_at = leased_until.saturating_sub(RECORD_BEFORE_LEASE_ENDS_MS);
    let mut wait = RELEASE_RETRY_MIN;
    loop {
        match commits.record_attempt(record.clone()).await {
            Ok(()) => return crate::delivery::observe(&attempt),
            Err(err) if err.is_transient() => {
                let wait_ms = i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
                if now_ms().saturating_add(wait_ms) >= give_up_at {
                    return give_up_on(&err);
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RELEASE_RETRY_MAX);
            }
            Err(err) => return give_up_on(&err),
        }
    }
}

/// How long (ms) before its delivery's lease ends an inline attempt's record stops being
/// retried: room for the last try to commit.
const RECORD_BEFORE_LEASE_ENDS_MS: i64 = 10_000;

/// The delivery stays leased, then due: the worker retries it.
fn give_up_on(err: &StoreError) {
    tracing::warn!(error = ?err, "could not record the inline delivery attempt");
}
