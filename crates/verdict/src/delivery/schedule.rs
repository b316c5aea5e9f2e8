//! The retry schedule: what state a delivery moves to after an attempt.
//!
//! One attempt inline during ingest, then up to `MAX_RETRIES` by the worker, `interval` apart
//! (or later, if the receiver's `Retry-After` asks for longer); then `dead`. Any 4xx other than
//! 429 is terminal (`failed`); a 410 also disables the tenant's endpoint.

use std::time::Duration;

/// Worker attempts after the inline one.
pub const MAX_RETRIES: i64 = 3;

/// How an attempt ended, as far as scheduling cares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx.
    Delivered,
    /// 5xx, 429, a network error or the deadline; `retry_after` from a 429/503.
    Retryable { retry_after: Option<Duration> },
    /// Any other 4xx, a redirect (not followed), or a refused destination.
    Terminal,
    /// 410: terminal, and the endpoint is disabled until re-enabled.
    Gone,
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
            Self::Inline => "inline",
            Self::Worker => "worker",
            Self::Redeliver => "redeliver",
        }
    }
}

/// The delivery's state after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    pub status: &'static str,
    pub retries_left: i64,
    pub next_attempt_at: i64,
    pub disable_endpoint: bool,
}

/// Where a delivery goes after `verdict` on an attempt by `trigger`.
pub fn next(
    verdict: &Verdict,
    trigger: Trigger,
    retries_left: i64,
    now: i64,
    interval: Duration,
) -> Next {
    let retries_left = match trigger {
        Trigger::Worker => (retries_left - 1).max(0),
        Trigger::Inline | Trigger::Redeliver => retries_left,
    };
    let done = |status| Next {
        status,
        retries_left,
        next_attempt_at: now,
        disable_endpoint: false,
    };
    match verdict {
        Verdict::Delivered => done("succeeded"),
        Verdict::Terminal => done("failed"),
        Verdict::Gone => Next {
            disable_endpoint: true,
            ..done("failed")
        },
        Verdict::Retryable { .. } if retries_left == 0 => done("dead"),
        Verdict::Retryable { retry_after } => {
            let wait = retry_after.map_or(interval, |asked| asked.max(interval));
            Next {
                next_attempt_at: now
                    .saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
                ..done("pending")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE_MIN: Duration = Duration::from_secs(300);
    const RETRY: Verdict = Verdict::Retryable { retry_after: None };

    #[test]
    fn one_inline_attempt_then_three_worker_attempts_then_dead() {
        let mut left = MAX_RETRIES;
        let first = next(&RETRY, Trigger::Inline, left, 0, FIVE_MIN);
        assert_eq!(
            (first.status, first.retries_left, first.next_attempt_at),
            ("pending", 3, 300_000)
        );
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let n = next(&RETRY, Trigger::Worker, left, 0, FIVE_MIN);
            left = n.retries_left;
            statuses.push(n.status);
        }
        assert_eq!(statuses, ["pending", "pending", "dead"]);
    }

    #[test]
    fn retry_after_is_honoured_only_when_longer_than_the_schedule() {
        let long = Verdict::Retryable {
            retry_after: Some(Duration::from_secs(3600)),
        };
        assert_eq!(
            next(&long, Trigger::Inline, 3, 0, FIVE_MIN).next_attempt_at,
            3_600_000
        );
        let short = Verdict::Retryable {
            retry_after: Some(Duration::from_secs(1)),
        };
        assert_eq!(
            next(&short, Trigger::Inline, 3, 0, FIVE_MIN).next_attempt_at,
            300_000
        );
    }

    #[test]
    fn gone_is_terminal_and_disables_the_endpoint() {
        let n = next(&Verdict::Gone, Trigger::Inline, 3, 0, FIVE_MIN);
        assert_eq!((n.status, n.disable_endpoint), ("failed", true));
        assert_eq!(
            next(&Verdict::Terminal, Trigger::Worker, 2, 0, FIVE_MIN).status,
            "failed"
        );
        assert_eq!(
            next(&Verdict::Delivered, Trigger::Worker, 1, 0, FIVE_MIN).status,
            "succeeded"
        );
    }
}
