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
//! starts there.

use std::time::{Duration, Instant};

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

/// How long a [`Sweep`] resumes where it left off before it starts again from the oldest rows.
pub const RESWEEP_EVERY: Duration = Duration::from_secs(600);

/// Where the pruner's batches have got to: the expiry and creation time from which keys and
/// events are still to be deleted.
///
/// A key that expired before the last one deleted is nearly always gone or claimed again (and
/// expires later), and new keys expire after now; an event is passed over while its delivery
/// is pending (or suspended). What a batch passes over like that (an event, or a key updated
/// between the batch's pick and its delete) is older than where the sweep got to, and waits
/// for the next sweep, which starts from the oldest rows every [`RESWEEP_EVERY`].
#[derive(Clone, Copy, Debug)]
pub struct Sweep {
    keys_from: i64,
    events_from: i64,
    started: Instant,
}

impl Sweep {
    /// A sweep from the oldest rows.
    pub fn new() -> Self {
        Self {
            keys_from: i64::MIN,
            events_from: i64::MIN,
            started: Instant::now(),
        }
    }

    /// This sweep, or a new one from the oldest rows once it is [`RESWEEP_EVERY`] old at
    /// `now`.
    pub fn renewed(self, now: Instant) -> Self {
        if now.saturating_duration_since(self.started) >= RESWEEP_EVERY {
            Self {
                started: now,
                ..Self::new()
            }
        } else {
            self
        }
    }
}

impl Default for Sweep {
    fn default() -> Self {
        Self::new()
    }
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
    fn timed(&mut self, started: Instant) {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
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
        pruned.timed(started);
        *field(pruned) += n;
        if n < BATCH as u64 {
            return Ok(Progress::Done);
        }
    }
    Ok(Progress::More)
}

/// Deletes what is past retention at `now` (unix ms), at most `max_batches` batches of each
/// kind, from where `sweep` got to; a run that stops at the bound says so, and leaves the rest
/// to the next.
pub async fn prune(
    store: &dyn RetentionStore,
    settings: RetentionSettings,
    now: i64,
    max_batches: usize,
    sweep: &mut Sweep,
) -> Result<(Pruned, Progress), StoreError> {
    let window = i64::try_from(settings.events.as_millis()).unwrap_or(i64::MAX);
    let before = now.saturating_sub(window);
    let suspended_before = now.saturating_sub(window.saturating_mul(SUSPENDED_RETENTION_FACTOR));
    let mut pruned = Pruned::default();
    let keys = prune_keys(store, now, max_batches, sweep, &mut pruned).await?;
    let events = prune_events(
        store,
        before,
        suspended_before,
        max_batches,
        sweep,
        &mut pruned,
    )
    .await?;
    let playbooks = drain(
        max_batches,
        &mut pruned,
        |p| &mut p.playbook_versions,
        || store.prune_playbooks(KEEP_PLAYBOOK_VERSIONS, BATCH),
    )
    .await?;
    let sessions = drain(
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
            .prune_expired_keys(sweep.keys_from, now, BATCH)
            .await?;
        pruned.timed(started);
        pruned.idempotency_keys += batch.deleted;
        sweep.keys_from = sweep.keys_from.max(batch.reached.unwrap_or(i64::MIN));
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
            .prune_events(sweep.events_from, before, suspended_before, BATCH)
            .await?;
        pruned.timed(started);
        sweep.events_from = sweep.events_from.max(batch.reached.unwrap_or(i64::MIN));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn resumed() -> Sweep {
        Sweep {
            keys_from: 1_000,
            events_from: 2_000,
            ..Sweep::new()
        }
    }

    #[test]
    fn a_sweep_resumes_where_it_got_to_until_it_is_due_again() {
        let sweep = resumed();
        let renewed = sweep.renewed(sweep.started + RESWEEP_EVERY - Duration::from_millis(1));
        assert_eq!((renewed.keys_from, renewed.events_from), (1_000, 2_000));
        assert_eq!(renewed.started, sweep.started);
    }

    #[test]
    fn a_sweep_that_is_due_starts_again_from_the_oldest_rows() {
        let sweep = resumed();
        let now = sweep.started + RESWEEP_EVERY;
        let renewed = sweep.renewed(now);
        assert_eq!(
            (renewed.keys_from, renewed.events_from),
            (i64::MIN, i64::MIN)
        );
        assert_eq!(renewed.started, now);
    }
}
