//! When to retry and how long to wait: exponential backoff with full jitter for failures, the
//! server's `Retry-After` for a signal still in flight.

use std::time::Duration;

use rand::Rng as _;
use reqwest::StatusCode;

/// Wait on 409 when the server gives no `Retry-After`; the server sends 2 s itself.
pub const DEFAULT_IN_FLIGHT_WAIT: Duration = Duration::from_secs(2);

/// The longest `Retry-After` honoured; a larger value waits this long instead.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Exponential backoff with full jitter: retry `n` waits a uniform time in `[0, min(max, base·2ⁿ)]`.
///
/// Full jitter spreads out clients that failed together, so they do not retry in lockstep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff starting at `base` and capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Backoff {
        Backoff { base, max }
    }

    /// The cap on the wait before retry number `retry` (0 for the first retry).
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// A random wait before retry number `retry` (0 for the first retry).
    pub fn delay(&self, retry: u32) -> Duration {
        let ceiling = u64::try_from(self.ceiling(retry).as_micros()).unwrap_or(u64::MAX);
        Duration::from_micros(rand::rng().random_range(0..=ceiling))
    }
}

/// What an answer means for the signal: the next step, named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// 2xx: done (a first answer or a replay).
    Accepted,
    /// 409: another attempt with this key is still being processed; wait as told, then retry.
    InFlight,
    /// 422: the key is held for a different body; never retry.
    KeyReused,
    /// 5xx or 429: transient; back off and retry.
    Transient,
    /// Any other status: the request is wrong; never retry.
    Rejected,
}

impl Disposition {
    /// Classifies a response status.
    pub(crate) fn of(status: StatusCode) -> Disposition {
        match status {
            s if s.is_success() => Disposition::Accepted,
            StatusCode::CONFLICT => Disposition::InFlight,
            StatusCode::UNPROCESSABLE_ENTITY => Disposition::KeyReused,
            // 429 happens before the key is claimed, so retrying is safe and expected.
            StatusCode::TOO_MANY_REQUESTS => Disposition::Transient,
            s if s.is_server_error() => Disposition::Transient,
            _ => Disposition::Rejected,
        }
    }
}

/// How long to wait before retry number `retry` after an answer with this disposition.
pub(crate) fn wait(
    disposition: Disposition,
    retry_after: Option<Duration>,
    backoff: &Backoff,
    retry: u32,
) -> Duration {
    let retry_after = retry_after.map(|d| d.min(MAX_RETRY_AFTER));
    match disposition {
        Disposition::InFlight => retry_after.unwrap_or(DEFAULT_IN_FLIGHT_WAIT),
        // The server's hint is a floor: never retry sooner than it asked.
        _ => backoff
            .delay(retry)
            .max(retry_after.unwrap_or(Duration::ZERO)),
    }
}

/// `Retry-After` in delta-seconds; an HTTP date or anything else counts as absent.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_doubles_per_retry_up_to_the_cap() {
        let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let ceilings: Vec<_> = (0..6).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn a_delay_is_never_above_its_ceiling() {
        let backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
        for retry in 0..10 {
            for _ in 0..100 {
                assert!(backoff.delay(retry) <= backoff.ceiling(retry));
            }
        }
    }

    #[test]
    fn delays_are_jittered() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(1));
        let delays: std::collections::HashSet<_> = (0..20).map(|_| backoff.delay(0)).collect();
        assert!(delays.len() > 1);
    }

    #[test]
    fn statuses_are_classified_as_the_contract_says() {
        let cases = [
            (200, Disposition::Accepted),
            (201, Disposition::Accepted),
            (409, Disposition::InFlight),
            (422, Disposition::KeyReused),
            (429, Disposition::Transient),
            (500, Disposition::Transient),
            (503, Disposition::Transient),
            (400, Disposition::Rejected),
            (401, Disposition::Rejected),
            (413, Disposition::Rejected),
            (415, Disposition::Rejected),
            (301, Disposition::Rejected),
        ];
        for (status, expected) in cases {
            let status = StatusCode::from_u16(status).expect("valid status");
            assert_eq!(Disposition::of(status), expected, "{status}");
        }
    }

    #[test]
    fn a_409_without_retry_after_waits_two_seconds() {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(1));
        let waited = wait(Disposition::InFlight, None, &backoff, 0);
        assert_eq!(waited, Duration::from_secs(2));
        let waited = wait(
            Disposition::InFlight,
            Some(Duration::from_secs(5)),
            &backoff,
            0,
        );
        assert_eq!(waited, Duration::from_secs(5));
    }

    #[test]
    fn retry_after_on_a_transient_failure_is_a_floor_and_is_capped() {
        let backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(1));
        let hint = Some(Duration::from_secs(3));
        assert_eq!(
            wait(Disposition::Transient, hint, &backoff, 0),
            Duration::from_secs(3)
        );
        let huge = Some(Duration::from_secs(86_400));
        assert_eq!(
            wait(Disposition::Transient, huge, &backoff, 0),
            MAX_RETRY_AFTER
        );
    }

    #[test]
    fn retry_after_is_read_as_delta_seconds_only() {
        assert_eq!(parse_retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }
}
