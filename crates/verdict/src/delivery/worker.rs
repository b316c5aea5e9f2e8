//! The delivery worker: wakes on a schedule, leases due deliveries, attempts each once.
//!
//! Leasing is one `UPDATE … RETURNING` (with `FOR UPDATE SKIP LOCKED` on PostgreSQL), committed
//! before any HTTP call, so several workers share the queue without sending the same attempt
//! and no transaction is held open across the network.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::schedule::{Trigger, Verdict};
use super::{Deliverer, lease_ms};
use crate::clock::now_ms;
use crate::store::StoreError;

/// Deliveries leased per batch.
const BATCH: i64 = 64;
/// Attempts in flight at once per worker.
const CONCURRENCY: usize = 16;

/// What one round did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub attempted: usize,
    pub delivered: usize,
}

/// Runs rounds every `interval` until cancelled.
pub async fn run(deliverer: Arc<Deliverer>, interval: Duration, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => match round(&deliverer, &stop).await {
                Ok(r) if r.attempted > 0 => {
                    tracing::info!(attempted = r.attempted, delivered = r.delivered, "delivery round done");
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "delivery round failed"),
            },
        }
    }
}

/// One round: attempts every delivery due now, once, then returns.
pub async fn round(
    deliverer: &Arc<Deliverer>,
    stop: &CancellationToken,
) -> Result<Round, StoreError> {
    let started = now_ms();
    let mut report = Round::default();
    loop {
        if stop.is_cancelled() {
            break;
        }
        // Only what was due when the round began: a delivery rescheduled by this round waits
        // for the next one.
        let now = now_ms().max(started);
        let due = deliverer
            .store
            .lease_due(started, now + lease_ms(), BATCH)
            .await?;
        if due.is_empty() {
            break;
        }
        let mut tasks = JoinSet::new();
        for delivery in due {
            while tasks.len() >= CONCURRENCY {
                collect(tasks.join_next().await, &mut report);
            }
            let deliverer = deliverer.clone();
            tasks.spawn(async move { deliverer.attempt(&delivery, Trigger::Worker).await });
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
    done: Option<Result<Result<Verdict, StoreError>, tokio::task::JoinError>>,
    report: &mut Round,
) {
    match done {
        Some(Ok(Ok(verdict))) => {
            report.attempted += 1;
            if verdict == Verdict::Delivered {
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
