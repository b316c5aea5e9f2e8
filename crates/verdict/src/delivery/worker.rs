//! The delivery worker: wakes on a schedule, leases due deliveries, attempts each once.
//!
//! Leasing is one `UPDATE … RETURNING` (with `FOR UPDATE SKIP LOCKED` on PostgreSQL), committed
//! before any HTTP call, so several workers share the queue without sending the same attempt
//! and no transaction is held open across the network.
//!
//! Rounds are scheduled on the wall clock the store uses, `interval` apart: a round has a
//! scheduled time, and a retry it makes is due one interval after that time, which is the
//! next round's. A round leases what is due when it leases, except what was attempted since the
//! round began, so it never attempts a delivery twice. It leases only what it attempts at once,
//! for longer than one attempt can take ([`super::lease_for`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::schedule::{AttemptOutcome, Trigger};
use super::{Deliverer, lease_for};
use crate::clock::now_ms;
use crate::store::StoreError;

/// Attempts in flight at once per worker.
const CONCURRENCY: usize = 16;
/// Deliveries leased per batch: only what is attempted at once, so none waits on its lease.
const BATCH: usize = CONCURRENCY;

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub attempted: usize,
    pub delivered: usize,
}

/// The first wait after a round failed because the database was unreachable; each further
/// failure doubles it, up to [`OUTAGE_BACKOFF_MAX`].
const OUTAGE_BACKOFF_MIN: Duration = Duration::from_millis(500);
/// The longest wait between rounds while the database stays unreachable: a long retry interval
/// does not also delay the queue's recovery by that much once it returns.
const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A database outage as the worker meets it: logged once when it begins and once when it
/// ends, whatever the number of rounds and rows it fails meanwhile.
#[derive(Debug, Default)]
struct Outage {
    since: Option<std::time::Instant>,
    failed_rounds: u32,
}

impl Outage {
    /// A round failed because the database is unreachable; returns how long to wait.
    fn failed(&mut self, err: &StoreError) -> Duration {
        if self.since.is_none() {
            tracing::warn!(
                error = %err,
                "database unreachable; delivery rounds back off until it answers"
            );
            self.since = Some(std::time::Instant::now());
        } else {
            tracing::debug!(error = %err, "database still unreachable");
        }
        self.failed_rounds = self.failed_rounds.saturating_add(1);
        OUTAGE_BACKOFF_MIN
            .saturating_mul(1 << self.failed_rounds.saturating_sub(1).min(16))
            .min(OUTAGE_BACKOFF_MAX)
    }

    /// A round went through: the outage, if any, is over.
    fn ended(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                down_ms = since.elapsed().as_millis() as u64,
                failed_rounds = self.failed_rounds,
                "database reachable again; delivery rounds resume"
            );
        }
        self.failed_rounds = 0;
    }
}

/// Runs rounds every `interval` until cancelled. While the database is unreachable, rounds are
/// retried with a backoff from [`OUTAGE_BACKOFF_MIN`] to [`OUTAGE_BACKOFF_MAX`] instead, and
/// the outage is logged once.
pub async fn run(deliverer: Arc<Deliverer>, interval: Duration, stop: CancellationToken) {
    let every = i64::try_from(interval.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let mut due_by = now_ms();
    let mut outage = Outage::default();
    loop {
        let mut next = due_by.saturating_add(every);
        match round_at(&deliverer, due_by, &stop).await {
            Ok(r) => {
                outage.ended();
                if r.attempted > 0 {
                    tracing::info!(
                        attempted = r.attempted,
                        delivered = r.delivered,
                        "delivery round done"
                    );
                }
            }
            Err(err) if err.is_transient() => {
                // The same round again after the backoff: what was due is due still.
                let wait = i64::try_from(outage.failed(&err).as_millis()).unwrap_or(every);
                next = now_ms().saturating_add(wait);
            }
            Err(err) => tracing::warn!(error = %err, "delivery round failed"),
        }
        // The next round is due one interval after this one was; a round that overran it
        // starts at once.
        let wait = next.saturating_sub(now_ms()).max(0);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())) => {}
        }
        due_by = now_ms().max(next);
    }
}

/// One round, now: attempts every delivery due, once, then returns.
pub async fn round(
    deliverer: &Arc<Deliverer>,
    stop: &CancellationToken,
) -> Result<Round, StoreError> {
    round_at(deliverer, now_ms(), stop).await
}

/// One round scheduled at `due_by`: attempts every delivery due, once, and schedules the
/// retries it makes from `due_by`.
pub async fn round_at(
    deliverer: &Arc<Deliverer>,
    due_by: i64,
    stop: &CancellationToken,
) -> Result<Round, StoreError> {
    let began = now_ms();
    let lease =
        i64::try_from(lease_for(deliverer.settings.deadline, BATCH, CONCURRENCY).as_millis())
            .unwrap_or(i64::MAX);
    let mut report = Round::default();
    loop {
        if stop.is_cancelled() {
            break;
        }
        // What is due now, but nothing attempted since the round began: a delivery this round
        // rescheduled waits for the next one.
        let now = now_ms().max(due_by);
        let due = deliverer
            .store
            .lease_due(now, began, now.saturating_add(lease), BATCH as i64)
            .await?;
        if due.is_empty() {
            break;
        }
        let mut tasks = JoinSet::new();
        for delivery in due {
            let deliverer = deliverer.clone();
            tasks.spawn(async move {
                deliverer
                    .attempt_due_at(&delivery, Trigger::Worker, due_by)
                    .await
            });
        }
        let mut unrecorded = None;
        while let Some(done) = tasks.join_next().await {
            if let Some(err) = collect(done, &mut report) {
                unrecorded = Some(err);
            }
        }
        // The database went away mid-round: its attempts wait for their leases to expire, and
        // the round ends as an outage (logged once by the caller, not once per row).
        if let Some(err) = unrecorded {
            return Err(err);
        }
    }
    metrics::gauge!("verdict_delivery_queue_depth")
        .set(deliverer.store.queue_depth(now_ms()).await? as f64);
    Ok(report)
}

/// Counts a finished attempt; returns a transient failure to record it, which is left to the
/// caller to report once.
fn collect(
    done: Result<Result<AttemptOutcome, StoreError>, tokio::task::JoinError>,
    report: &mut Round,
) -> Option<StoreError> {
    match done {
        Ok(Ok(outcome)) => {
            report.attempted += 1;
            if outcome == AttemptOutcome::Delivered {
                report.delivered += 1;
            }
            None
        }
        Ok(Err(err)) => {
            report.attempted += 1;
            // The lease expires and the delivery is attempted again in a later round.
            if err.is_transient() {
                return Some(err);
            }
            tracing::warn!(error = %err, "could not record a delivery attempt");
            None
        }
        Err(err) => {
            tracing::error!(error = %err, "a delivery task panicked");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> StoreError {
        StoreError::Unavailable(sqlx::Error::PoolTimedOut)
    }

    #[test]
    fn an_outage_backs_off_from_half_a_second_doubling_to_thirty() {
        let mut outage = Outage::default();
        let waits: Vec<u128> = (0..9)
            .map(|_| outage.failed(&unreachable()).as_millis())
            .collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        outage.ended();
        assert_eq!(outage.failed(&unreachable()).as_millis(), 500);
    }
}
