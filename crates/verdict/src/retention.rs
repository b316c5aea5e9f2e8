//! Retention: what is deleted once it is old enough, besides expired idempotency keys.
//!
//! - Events older than the retention window (90 days by default), with their deliveries, the
//!   deliveries' attempts; never an event whose delivery is still
//!   pending (waiting, retrying or leased). An event whose callback is suspended (decided
//!   while the endpoint was disabled) is kept like a pending one, but only up to
//!   [`SUSPENDED_RETENTION_FACTOR`] times the window from its creation: an endpoint left
//!   disabled that long is abandoned, and its callbacks must not grow the database for ever.
//!   The state events produced stays: an account lock,
//!   a standing deny, an open case, an alert window and a ledger entry outlive the events that
//!   made them, since deleting them would change later decisions.
//! - Playbook versions older than each tenant's newest [`KEEP_PLAYBOOK_VERSIONS`], unless an
//!   event still names them.
//! - Console sessions past their idle or absolute end, or whose API key is revoked (they no
//!   longer sign anyone in; this only keeps the table small).
//!
//! Deletes go in batches of [`BATCH`], each its own transaction, so the pruner never holds the
//! database (SQLite's single writer above all) for long.

use std::time::Duration;

use crate::store::StoreError;

pub use crate::store::ports::RetentionStore;

/// Playbook versions kept per tenant whatever their age.
pub const KEEP_PLAYBOOK_VERSIONS: i64 = 50;

/// How many retention windows an event with a suspended callback is kept from its creation.
pub const SUSPENDED_RETENTION_FACTOR: i64 = 2;

/// Rows deleted per statement batch.
pub const BATCH: i64 = 500;

/// How long events are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    pub events: Duration,
}

/// What a run deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Pruned {
    pub events: u64,
    pub deliveries: u64,
    pub delivery_attempts: u64,
    pub playbook_versions: u64,
    pub console_sessions: u64,
}

impl Pruned {
    /// Whether anything was deleted.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Deletes what is past retention at `now` (unix ms), at most `max_batches` batches of each
/// kind; a run that stops at the bound leaves the rest to the next.
pub async fn prune(
    store: &dyn RetentionStore,
    settings: RetentionSettings,
    now: i64,
    max_batches: usize,
) -> Result<Pruned, StoreError> {
    let window = i64::try_from(settings.events.as_millis()).unwrap_or(i64::MAX);
    let before = now.saturating_sub(window);
    let suspended_before = now.saturating_sub(window.saturating_mul(SUSPENDED_RETENTION_FACTOR));
    let mut pruned = Pruned::default();
    for _ in 0..max_batches {
        let batch = store.prune_events(before, suspended_before, BATCH).await?;
        pruned.events += batch.events;
        pruned.deliveries += batch.deliveries;
        pruned.delivery_attempts += batch.attempts;
        // Fewer selected than asked for: nothing older is left. A batch that selected events
        // only to keep them all (a delivery turned pending meanwhile) also ends the run, so
        // kept events are not selected again and again.
        if batch.selected < BATCH as u64 || batch.events == 0 {
            break;
        }
    }
    for _ in 0..max_batches {
        let n = store.prune_playbooks(KEEP_PLAYBOOK_VERSIONS, BATCH).await?;
        pruned.playbook_versions += n;
        if n < BATCH as u64 {
            break;
        }
    }
    for _ in 0..max_batches {
        let n = store.prune_console_sessions(now, BATCH).await?;
        pruned.console_sessions += n;
        if n < BATCH as u64 {
            break;
        }
    }
    Ok(pruned)
}
