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

/// Runs rounds every `interval` until cancelled.
pub async fn run(deliverer: Arc<Deliverer>, interval: Duration, stop: CancellationToken) {
    let every = i64::try_from(interval.as_millis())
        .unwrap_or(i64::MAX)
        .max(1);
    let mut due_by = now_ms();
    loop {
        match round_at(&deliverer, due_by, &stop).await {
            Ok(r) if r.attempted > 0 => {
                tracing::info!(
                    attempted = r.attempted,
                    delivered = r.delivered,
                    "delivery round done"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "delivery round failed"),
        }
        // The next round is due one interval after this one was; a round that overran it
        // starts at once.
        let next = due_by.saturating_add(every);
        let wait = next.saturating_sub(now_ms()).clamp(0, every);
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
        while let Some(done) = tasks.join_next().await {
            collect(Some(done), &mut report);
        }
    }
    metrics::gauge!("verdict_delivery_queue_depth")
        .set(deliverer.store.queue_depth(now_ms()).await? as f64);
    Ok(report)
}

fn collect(
    done: Option<Result<Result<AttemptOutcome, StoreError>, tokio::task::JoinError>>,
    report: &mut Round,
) {
    match done {
        Some(Ok(Ok(outcome))) => {
            report.attempted += 1;
            if outcome == AttemptOutcome::Delivered {
                report.delivered += 1;
            }
        }
        Some(Ok(Err(err))) => {
            report.attempted += 1;
            // The lease expires and the delivery is attempted again in a later round.
            tracing::warn!(error = %err, "could not record a delivery attempt");
        }
        Some(Err(err)) => tracing::error!(error = %err, "a delivery task panicked"),
        None => {}
    }
}
