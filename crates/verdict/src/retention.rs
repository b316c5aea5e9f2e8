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

use std::time::{Duration, Instant};

use crate::store::{StoreError, SweepPosition};

pub use crate::store::ports::RetentionStore;
pub use crate::store::sweep::SweepStore;

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

/// How long a [`Sweep`] resumes where it left off before it goes back to the oldest row its
/// batches left behind.
pub const RESWEEP_EVERY: Duration = Duration::from_secs(600);

/// How long before a sweep starts again from the oldest rows of all, for whatever no batch
/// walked past (a row whose time was set behind the sweep, by a clock moved back).
pub const RESWEEP_ALL_EVERY: Duration = Duration::from_secs(24 * 3600);

/// Where the pruner's batches have got to: the expiry and creation time from which keys and
/// events are still to be deleted, and the oldest of each that a batch left behind.
///
/// An event is passed over while its delivery is pending (or suspended), and a key updated
/// between a batch's pick and its delete is left; each batch says where the oldest row it left
/// is, and every [`RESWEEP_EVERY`] the sweep goes back there, not to the oldest rows: those, until
/// a vacuum, are the rows pruned before, and a batch from them walks every one. Kept in the
/// database ([`SweepStore`]), so a restarted server resumes it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweep(SweepPosition);

impl Sweep {
    /// A sweep from the oldest rows, started at `now` (unix ms).
    pub fn new(now: i64) -> Self {
        Self(SweepPosition {
            keys_from: i64::MIN,
            events_from: i64::MIN,
            keys_left: None,
            events_left: None,
            started_at: now,
            whole_started_at: now,
        })
    }

    /// The sweep a saved position describes.
    pub fn resumed(position: SweepPosition) -> Self {
        Self(position)
    }

    /// Its position, to save.
    pub fn position(&self) -> SweepPosition {
        self.0
    }

    /// This sweep at `now` (unix ms): once it is [`RESWEEP_EVERY`] old, one from the oldest
    /// rows it left behind (or on from where it is, if it left none); once the last sweep from
    /// the oldest rows is [`RESWEEP_ALL_EVERY`] old, one from those. A time ahead of `now` (a
    /// clock moved back) counts as due.
    pub fn renewed(self, now: i64) -> Self {
        let due = |since: i64, every: Duration| {
            now < since
                || now.saturating_sub(since) >= i64::try_from(every.as_millis()).unwrap_or(i64::MAX)
        };
        let at = self.0;
        if due(at.whole_started_at, RESWEEP_ALL_EVERY) {
            Self::new(now)
        } else if due(at.started_at, RESWEEP_EVERY) {
            Self(SweepPosition {
                keys_from: at.keys_left.unwrap_or(at.keys_from),
                events_from: at.events_left.unwrap_or(at.events_from),
                keys_left: None,
                events_left: None,
                started_at: now,
                whole_started_at: at.whole_started_at,
            })
        } else {
            self
        }
    }
}

/// The earlier of two positions left behind.
fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    [a, b].into_iter().flatten().min()
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
            .prune_expired_keys(sweep.0.keys_from, now, BATCH)
            .await?;
        pruned.timed(started);
        pruned.idempotency_keys += batch.deleted;
        sweep.0.keys_from = sweep.0.keys_from.max(batch.reached.unwrap_or(i64::MIN));
        sweep.0.keys_left = earliest(sweep.0.keys_left, batch.left);
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
            .prune_events(sweep.0.events_from, before, suspended_before, BATCH)
            .await?;
        pruned.timed(started);
        sweep.0.events_from = sweep.0.events_from.max(batch.reached.unwrap_or(i64::MIN));
        sweep.0.events_left = earliest(sweep.0.events_left, batch.left);
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

    const MINUTE: i64 = 60_000;

    /// A sweep started at minute 0, now at 1,000 and 2,000, that left a key at 400 and an
    /// event at 700.
    fn under_way() -> Sweep {
        Sweep(SweepPosition {
            keys_from: 1_000,
            events_from: 2_000,
            keys_left: Some(400),
            events_left: Some(700),
            started_at: 0,
            whole_started_at: 0,
        })
    }

    #[test]
    fn a_sweep_resumes_where_it_got_to_until_it_is_due_again() {
        let sweep = under_way();
        assert_eq!(sweep.renewed(10 * MINUTE - 1), sweep);
    }

    #[test]
    fn a_sweep_that_is_due_goes_back_to_the_oldest_rows_it_left() {
        let renewed = under_way().renewed(10 * MINUTE).position();
        assert_eq!((renewed.keys_from, renewed.events_from), (400, 700));
        assert_eq!((renewed.keys_left, renewed.events_left), (None, None));
        assert_eq!(
            (renewed.started_at, renewed.whole_started_at),
            (10 * MINUTE, 0)
        );
    }

    #[test]
    fn a_sweep_that_left_nothing_goes_on_from_where_it_is() {
        let mut sweep = under_way();
        sweep.0.keys_left = None;
        sweep.0.events_left = None;
        let renewed = sweep.renewed(10 * MINUTE).position();
        assert_eq!((renewed.keys_from, renewed.events_from), (1_000, 2_000));
    }

    #[test]
    fn once_a_day_a_sweep_starts_again_from_the_oldest_rows() {
        let now = 24 * 60 * MINUTE;
        assert_eq!(under_way().renewed(now), Sweep::new(now));
    }

    #[test]
    fn a_sweep_started_ahead_of_the_clock_is_due() {
        let mut sweep = under_way();
        sweep.0.started_at = 20 * MINUTE;
        assert_eq!(sweep.renewed(5 * MINUTE).position().events_from, 700);
        sweep.0.whole_started_at = 20 * MINUTE;
        assert_eq!(sweep.renewed(5 * MINUTE), Sweep::new(5 * MINUTE));
    }

    #[test]
    fn a_sweep_saved_at_the_oldest_time_is_due_without_overflow() {
        let mut sweep = under_way();
        sweep.0.whole_started_at = i64::MIN;
        assert_eq!(sweep.renewed(5 * MINUTE), Sweep::new(5 * MINUTE));
    }

    #[test]
    fn the_oldest_row_left_is_kept_across_batches() {
        assert_eq!(earliest(Some(5), Some(3)), Some(3));
        assert_eq!(earliest(None, Some(3)), Some(3));
        assert_eq!(earliest(Some(5), None), Some(5));
        assert_eq!(earliest(None, None), None);
    }
}
