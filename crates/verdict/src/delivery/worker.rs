//! The delivery worker: wakes on a schedule, leases due deliveries, attempts each once.
//!
//! Leasing is one `UPDATE … RETURNING` (with `FOR UPDATE SKIP LOCKED` on PostgreSQL), committed
//! before any HTTP call, so several workers share the queue without sending the same attempt
//! and no transaction is held open across the network.
//!
//! Rounds are scheduled on the wall clock the store uses, at most `interval` apart, and sooner
//! when a delivery is due before that: an inline attempt's retry is due one interval after
//! the attempt, which need not be a round's time, and goes out when due, not at the round
//! after. A round has a scheduled time, and a retry it makes is due one interval after that
//! time. A round leases what is due when it leases, except what was attempted since the
//! round began, so it never attempts a delivery twice. It leases only what it attempts at once,
//! for longer than one attempt can take ([`super::lease_for`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Deliverer;
use super::schedule::{AttemptOutcome, Trigger};
use crate::clock::now_ms;
use crate::store::StoreError;
use uuid::Uuid;

/// Attempts in flight at once per worker; each delivery is leased only when a slot takes it,
/// so none waits on its lease.
const CONCURRENCY: usize = 16;
/// Attempts in flight from which a tenant is skipped by the next lease: with leases of at most
/// [`REFILL`], one tenant holds at most `PER_TENANT + REFILL - 1` slots, and the rest stay for
/// everyone else.
const PER_TENANT: usize = CONCURRENCY / 2;
/// Deliveries leased at once, and the free slots that make the worker lease again while
/// attempts are in flight (one query per few attempts, not one per attempt).
const REFILL: usize = 4;

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

/// The shortest wait between rounds that a due delivery brings forward: one the round could
/// not lease (in flight elsewhere, or its tenant at its share) is tried again this much later,
/// not in a loop.
const MIN_ROUND_GAP_MS: i64 = 1000;

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
                next = sooner_if_due(&deliverer, next).await;
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

/// The next round's time: `scheduled`, or the earliest queued delivery's due time or lease end
/// not yet swept, if that is sooner (but at least [`MIN_ROUND_GAP_MS`] from now). A delivery
/// made after this is looked at is due an interval or more after its first attempt, or leased
/// until a minute after it was made, so after `scheduled`, which is at most an interval away:
/// the round at `scheduled` sees it, or its lease's end.
async fn sooner_if_due(deliverer: &Deliverer, scheduled: i64) -> i64 {
    match deliverer.store.next_due().await {
        Ok(Some(due)) => scheduled.min(due.max(now_ms().saturating_add(MIN_ROUND_GAP_MS))),
        Ok(None) => scheduled,
        Err(err) => {
            tracing::debug!(error = %err, "could not read the next due delivery");
            scheduled
        }
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
///
/// Attempts run side by side in [`CONCURRENCY`] slots, and a slot is refilled as soon as its
/// attempt ends, so a receiver that hangs holds only its own slots. No tenant has more than
/// about [`PER_TENANT`] attempts in flight: a tenant whose receiver hangs on many deliveries
/// cannot take every slot and hold back other tenants' retries for a deadline per batch.
pub async fn round_at(
    deliverer: &Arc<Deliverer>,
    due_by: i64,
    stop: &CancellationToken,
) -> Result<Round, StoreError> {
    let began = now_ms();
    // What a dead holder left under its lease joins the queue once that lease is over.
    deliverer.store.queue_lapsed_leases(began).await?;
    let lease = i64::try_from(deliverer.settings.lease().as_millis()).unwrap_or(i64::MAX);
    let mut report = Round::default();
    let mut tasks = JoinSet::new();
    let mut in_flight: HashMap<Uuid, usize> = HashMap::new();
    let mut tenants: HashMap<tokio::task::Id, Uuid> = HashMap::new();
    // Why the round stops leasing (the database went away); it ends once in-flight attempts do.
    let mut failed: Option<StoreError> = None;
    loop {
        // Refill the free slots a few at a time, so that no one lease hands a single tenant
        // more than its share before the next one skips it.
        while failed.is_none() && !stop.is_cancelled() {
            let free = CONCURRENCY - tasks.len();
            if free < REFILL && !tasks.is_empty() {
                break;
            }
            let want = free.min(REFILL);
            // What is due now, but nothing attempted since the round began: a delivery this
            // round rescheduled waits for the next one.
            let now = now_ms().max(due_by);
            let full: Vec<Uuid> = in_flight
                .iter()
                .filter(|&(_, &n)| n >= PER_TENANT)
                .map(|(&tenant, _)| tenant)
                .collect();
            let due = match deliverer
                .store
                .lease_due(now, began, now.saturating_add(lease), want as i64, &full)
                .await
            {
                Ok(due) => due,
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            };
            let leased = due.len();
            for delivery in due {
                *in_flight.entry(delivery.tenant_id).or_default() += 1;
                let tenant = delivery.tenant_id;
                let deliverer = deliverer.clone();
                let task = tasks.spawn(async move {
                    deliverer
                        .attempt_due_at(&delivery, Trigger::Worker, due_by)
                        .await
                });
                tenants.insert(task.id(), tenant);
            }
            if leased < want {
                break;
            }
        }
        let Some(done) = tasks.join_next_with_id().await else {
            break;
        };
        // The attempt's tenant has one fewer in flight, however the attempt ended.
        let id = match &done {
            Ok((id, _)) => *id,
            Err(err) => err.id(),
        };
        if let Some(tenant) = tenants.remove(&id)
            && let Some(n) = in_flight.get_mut(&tenant)
        {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&tenant);
            }
        }
        let done = done.map(|(_, outcome)| outcome);
        // The database went away mid-round: this attempt waits for its lease to expire, and
        // the round ends as an outage (logged once by the caller, not once per row).
        if let Some(err) = collect(done, &mut report) {
            failed.get_or_insert(err);
        }
    }
    if let Some(err) = failed {
        return Err(err);
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
