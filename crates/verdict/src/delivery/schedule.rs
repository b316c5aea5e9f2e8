//! The retry schedule: what state a delivery moves to after an attempt.
//!
//! One attempt inline during ingest, then up to `MAX_RETRIES` by the worker, `interval` apart
//! (or later, if the receiver's `Retry-After` asks for longer); then `dead`. Any 4xx other than
//! 429 is terminal (`failed`); a 410 also disables the tenant's endpoint.

use std::time::Duration;

pub use crate::domain::{DeliveryStatus, Next, UnknownStatus};

/// Worker attempts after the inline one.
pub const MAX_RETRIES: i64 = 3;

/// The longest a receiver's `Retry-After` may put a retry off: a day. Longer, and a delivery
/// could be parked past any receiver's deduplication window (or, at the largest values, for
/// ever, kept from dying and from retention).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// How an attempt ended, as far as scheduling cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// 2xx.
    Delivered,
    /// 5xx, 429, a network error or the deadline; `retry_after` from a 429/503. Also an attempt
    /// not made because the tenant has no live webhook secret (callbacks never go out
    /// unsigned): a secret may be issued before the retries run out, and a dead delivery can be
    /// redelivered once one is.
    Retryable { retry_after: Option<Duration> },
    /// Any other 4xx, a redirect (not followed), or a refused destination.
    Terminal,
    /// 410: terminal, and the endpoint is disabled until re-enabled.
    Gone,
    /// An at-most-once connector's call that may or may not have acted: never retried.
    Unknown,
}

/// Who made the attempt; only the worker's attempts spend retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    Inline,
    Worker,
    Redeliver,
}

impl Trigger {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inline => crate::store::deliveries::INLINE_TRIGGER,
            Self::Worker => "worker",
            Self::Redeliver => "redeliver",
        }
    }
}

/// Where a delivery goes after `outcome` on an attempt by `trigger`. `base` is when the attempt
/// was due (a worker round's scheduled time) or began, never when it ended: a retry is due one
/// interval after the attempt it follows was due, so the worker's next round takes it.
pub fn next(
    outcome: &AttemptOutcome,
    trigger: Trigger,
    retries_left: i64,
    base: i64,
    interval: Duration,
) -> Next {
    let retries_left = match trigger {
        Trigger::Worker => (retries_left - 1).max(0),
        Trigger::Inline | Trigger::Redeliver => retries_left,
    };
    let done = |status| Next {
        status,
        retries_left,
        next_attempt_at: base,
        disable_endpoint: false,
    };
    match outcome {
        AttemptOutcome::Delivered => done(DeliveryStatus::Succeeded),
        AttemptOutcome::Terminal => done(DeliveryStatus::Failed),
        AttemptOutcome::Unknown => done(DeliveryStatus::Unknown),
        AttemptOutcome::Gone => Next {
            disable_endpoint: true,
            ..done(DeliveryStatus::Failed)
        },
        AttemptOutcome::Retryable { .. } if retries_left == 0 => done(DeliveryStatus::Dead),
        AttemptOutcome::Retryable { retry_after } => {
            let wait =
                retry_after.map_or(interval, |asked| asked.min(MAX_RETRY_AFTER).max(interval));
            Next {
                next_attempt_at: base
                    .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
                ..done(DeliveryStatus::Pending)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(300);
    const RETRY: AttemptOutcome = AttemptOutcome::Retryable { retry_after: None };

    #[test]
    fn one_inline_attempt_then_three_worker_attempts_then_dead() {
        let mut left = MAX_RETRIES;
        let first = next(&RETRY, Trigger::Inline, left, 0, FIVE_MIN);
        assert_eq!(
            (first.status, first.retries_left, first.next_attempt_at),
            (DeliveryStatus::Pending, 3, 300_000)
        );
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let n = next(&RETRY, Trigger::Worker, left, 0, FIVE_MIN);
            left = n.retries_left;
            statuses.push(n.status);
        }
        assert_eq!(
            statuses,
            [
                DeliveryStatus::Pending,
                DeliveryStatus::Pending,
                DeliveryStatus::Dead
            ]
        );
    }

    #[test]
    fn retry_after_is_honoured_only_when_longer_than_the_schedule() {
        let long = AttemptOutcome::Retryable {
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(
            next(&long, Trigger::Inline, 3, 0, FIVE_MIN).next_attempt_at,
            3_600_000
        );
        let short = AttemptOutcome::Retryable {
            retry_after: Some(Duration::from_secs(1)),
        };
        assert_eq!(
            next(&short, Trigger::Inline, 3, 0, FIVE_MIN).next_attempt_at,
            300_000
        );
    }

    #[test]
    fn retry_after_is_clamped_to_a_day() {
        let forever = AttemptOutcome::Retryable {
            retry_after: Some(Duration::from_secs(u64::MAX)),
        };
        let n = next(&forever, Trigger::Inline, 3, 1_000, FIVE_MIN);
        assert_eq!(n.status, DeliveryStatus::Pending);
        assert_eq!(n.next_attempt_at, 1_000 + 86_400_000);
    }

    #[test]
    fn gone_is_terminal_and_disables_the_endpoint() {
        let n = next(&AttemptOutcome::Gone, Trigger::Inline, 3, 0, FIVE_MIN);
        assert_eq!(
            (n.status, n.disable_endpoint),
            (DeliveryStatus::Failed, true)
        );
        assert_eq!(
            next(&AttemptOutcome::Terminal, Trigger::Worker, 2, 0, FIVE_MIN).status,
            DeliveryStatus::Failed
        );
        assert_eq!(
            next(&AttemptOutcome::Delivered, Trigger::Worker, 1, 0, FIVE_MIN).status,
            DeliveryStatus::Succeeded
        );
    }

    #[test]
    fn the_next_attempt_counts_from_when_this_one_was_due_not_when_it_ended() {
        // A round scheduled at t = 10 s, with a 1 s interval: the retry is due at 11 s, the
        // next round's time, however long the send took.
        let n = next(&RETRY, Trigger::Worker, 3, 10_000, Duration::from_secs(1));
        assert_eq!(n.next_attempt_at, 11_000);
    }

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in DeliveryStatus::ALL {
            assert_eq!(status.as_str().parse::<DeliveryStatus>(), Ok(status));
        }
        assert_eq!(
            "bogus".parse::<DeliveryStatus>(),
            Err(UnknownStatus("bogus".into()))
        );
        assert!("Pending".parse::<DeliveryStatus>().is_err());
    }
}
