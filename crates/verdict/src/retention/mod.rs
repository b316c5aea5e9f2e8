//! Retention: what is deleted once it is old enough.
//!
//! - Idempotency keys past their lifetime (24 hours by default).
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
//! database (SQLite's single writer above all) for long. A run does at most a given number of
//! batches of each kind and says whether it stopped at that bound ([`Progress::More`]); the
//! server's pruner then runs again at once, so a backlog (ten million rows after a long outage
//! or a shortened window) is worked off at the database's delete rate, not one run a minute.
//!
//! Keys and events are deleted oldest first, so the oldest entries of the indexes that find
//! them are the rows deleted before, dead until a vacuum; a scan from the start walks all of
//! them, batch after batch. A [`Sweep`] remembers where its batches left off, and each batch
//! starts there; the database keeps it, so a restarted server goes on from there too.

mod sweep;

use std::time::{Duration, Instant};

use crate::store::{StoreError, SweepPosition};

pub use crate::store::ports::RetentionStore;
pub use crate::store::sweep::SweepStore;
pub use sweep::{RESWEEP_ALL_EVERY, RESWEEP_EVERY, Sweep};

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
    pub idempotency_keys: u64,
    pub events: u64,
    pub deliveries: u64,
    pub delivery_attempts: u64,
    pub playbook_versions: u64,
    pub console_sessions: u64,
    /// The longest batch's time, the longest the run held the database at once (ms).
    pub longest_batch_ms: u64,
}

impl Pruned {
    /// Whether anything was deleted.
    pub fn is_empty(&self) -> bool {
        Self {
            longest_batch_ms: 0,
            ..*self
        } == Self::default()
    }

    /// Notes one batch's time.
    fn timed(&mut self, kind: &'static str, rows: u64, started: Instant) {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::debug!(kind, rows, ms, "pruning batch");
        self.longest_batch_ms = self.longest_batch_ms.max(ms);
    }
}

/// Whether a run left work behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing past retention is left (that the run could delete).
    Done,
    /// The run stopped at its bound of batches with rows still to delete.
    More,
}

/// Runs `batch` (which deletes at most [`BATCH`] rows and returns how many) until a batch
/// comes back short or `max_batches` ran; adds what it deleted to the count `field` picks.
async fn drain<F, Fut>(
    kind: &'static str,
    max_batches: usize,
    pruned: &mut Pruned,
    field: fn(&mut Pruned) -> &mut u64,
    mut batch: F,
) -> Result<Progress, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, StoreError>>,
{
    for _ in 0..max_batches {
        let started = Instant::now();
        let n = batch().await?;
        pruned.timed(kind, n, started);
        *field(pruned) += n;
        if n < BATCH as u64 {
            return Ok(Progress::Done);
        }
    }
    Ok(Progress::More)
}

/// The pruner between runs: where its sweep got to, and the position saved last.
#[derive(Clone, Copy, Debug)]
pub struct Pruner {
    sweep: Sweep,
    /// The position saved last, or the one it started from: a run that moved nothing writes
    /// nothing.
    saved: SweepPosition,
}

impl Pruner {
    /// A pruner that goes on with `sweep`.
    pub fn new(sweep: Sweep) -> Self {
        Self {
            sweep,
            saved: sweep.position(),
        }
    }

    /// The pruner that resumes the sweep the last one saved; one from the oldest rows, started
    /// at `now` (unix ms), when none was saved or it cannot be read.
    pub async fn resumed(store: &dyn RetentionStore, now: i64) -> Self {
        match store.sweep_position().await {
            Ok(Some(position)) => {
                tracing::info!(
                    keys_from = position.keys_from,
                    events_from = position.events_from,
                    "pruner resumes the saved sweep"
                );
                Self::new(Sweep::resumed(position))
            }
            Ok(None) => Self::new(Sweep::new(now)),
            Err(err) => {
                tracing::warn!(error = ?err, "reading the pruner's saved sweep failed");
                Self::new(Sweep::new(now))
            }
        }
    }

    /// Where its sweep got to.
    pub fn sweep(&self) -> Sweep {
        self.sweep
    }

    /// Deletes what is past retention at `now` (unix ms), at most `max_batches` batches of
    /// each kind, from where the sweep (renewed at `now`) got to; a run that stops at the
    /// bound says so, and leaves the rest to the next.
    pub async fn run(
        &mut self,
        store: &dyn RetentionStore,
        settings: RetentionSettings,
        now: i64,
        max_batches: usize,
    ) -> Result<(Pruned, Progress), StoreError> {
        self.sweep = self.sweep.renewed(now);
        let window = i64::try_from(settings.events.as_millis()).unwrap_or(i64::MAX);
        let before = now.saturating_sub(window);
        let suspended_before =
            now.saturating_sub(window.saturating_mul(SUSPENDED_RETENTION_FACTOR));
        let mut pruned = Pruned::default();
        let keys = prune_keys(store, now, max_batches, &mut self.sweep, &mut pruned).await?;
        let events = prune_events(
            store,
            before,
            suspended_before,
            max_batches,
            &mut self.sweep,
            &mut pruned,
        )
        .await?;
        let playbooks = drain(
            "playbook_versions",
            max_batches,
            &mut pruned,
            |p| &mut p.playbook_versions,
            || store.prune_playbooks(KEEP_PLAYBOOK_VERSIONS, BATCH),
        )
        .await?;
        let sessions = drain(
            "console_sessions",
            max_batches,
            &mut pruned,
            |p| &mut p.console_sessions,
            || store.prune_console_sessions(now, BATCH),
        )
        .await?;
        let progress = if [keys, events, playbooks, sessions].contains(&Progress::More) {
            Progress::More
        } else {
            Progress::Done
        };
        Ok((pruned, progress))
    }

    /// Saves where the sweep got to, unless it is where it was last saved (or started).
    pub async fn save(&mut self, store: &dyn RetentionStore) -> Result<(), StoreError> {
        let position = self.sweep.position();
        if position != self.saved {
            store.save_sweep_position(&position).await?;
            self.saved = position;
        }
        Ok(())
    }
}

/// Expired keys, in batches, from where the sweep got to.
async fn prune_keys(
    store: &dyn RetentionStore,
    now: i64,
    max_batches: usize,
    sweep: &mut Sweep,
    pruned: &mut Pruned,
) -> Result<Progress, StoreError> {
    for _ in 0..max_batches {
        let started = Instant::now();
        let batch = store
            .prune_expired_keys(sweep.keys_from(), now, BATCH)
            .await?;
        pruned.timed("idempotency_keys", batch.deleted, started);
        pruned.idempotency_keys += batch.deleted;
        sweep.passed_keys(batch.reached, batch.left);
        if batch.deleted < BATCH as u64 {
            return Ok(Progress::Done);
        }
    }
    Ok(Progress::More)
}

/// Events past retention, with their deliveries and attempts, in batches from where the sweep
/// got to.
async fn prune_events(
    store: &dyn RetentionStore,
    before: i64,
    suspended_before: i64,
    max_batches: usize,
    sweep: &mut Sweep,
    pruned: &mut Pruned,
) -> Result<Progress, StoreError> {
    for _ in 0..max_batches {
        let started = Instant::now();
        let batch = store
            .prune_events(sweep.events_from(), before, suspended_before, BATCH)
            .await?;
        pruned.timed("events", batch.events, started);
        sweep.passed_events(batch.reached, batch.left);
        pruned.events += batch.events;
        pruned.deliveries += batch.deliveries;
        pruned.delivery_attempts += batch.attempts;
        // Fewer selected than asked for: nothing older is left. A batch that selected events
        // only to keep them all (a delivery turned pending meanwhile) also ends the run, so
        // kept events are not selected again and again.
        if batch.selected < BATCH as u64 || batch.events == 0 {
            return Ok(Progress::Done);
        }
    }
    Ok(Progress::More)
}
