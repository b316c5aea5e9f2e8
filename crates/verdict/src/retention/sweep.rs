//! Where the pruner's batches have got to, kept across runs and restarts.

use std::time::Duration;

use crate::store::SweepPosition;

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
/// database ([`SweepStore`](crate::store::SweepStore)), so a restarted server resumes it too.
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

    /// The expiry key batches go on from.
    pub(super) fn keys_from(&self) -> i64 {
        self.0.keys_from
    }

    /// The creation time event batches go on from.
    pub(super) fn events_from(&self) -> i64 {
        self.0.events_from
    }

    /// Notes a key batch that reached expiry `reached` and left a key at `left`.
    pub(super) fn passed_keys(&mut self, reached: Option<i64>, left: Option<i64>) {
        self.0.keys_from = self.0.keys_from.max(reached.unwrap_or(i64::MIN));
        self.0.keys_left = earliest(self.0.keys_left, left);
    }

    /// Notes an event batch that reached creation time `reached` and left an event at `left`.
    pub(super) fn passed_events(&mut self, reached: Option<i64>, left: Option<i64>) {
        self.0.events_from = self.0.events_from.max(reached.unwrap_or(i64::MIN));
        self.0.events_left = earliest(self.0.events_left, left);
    }
}

/// The earlier of two positions left behind.
fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    [a, b].into_iter().flatten().min()
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
