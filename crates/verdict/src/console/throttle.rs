//! The sign-in throttle: failed sign-ins counted per client address and per key prefix in fixed
//! windows, so guessing keys or hammering one key's prefix is slowed to a handful an address
//! (or prefix) per window. Held in memory on each instance: with N instances a guesser gets N
//! times the budget, still far too little to find a 32-byte key.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Failed sign-ins one client address may make per window.
pub const FAILURES_PER_ADDRESS: u32 = 20;
/// Failed sign-ins with one key prefix per window, from anywhere.
pub const FAILURES_PER_PREFIX: u32 = 10;
/// How long a window lasts from its first attempt.
pub const WINDOW: Duration = Duration::from_secs(300);
/// Characters of a submitted key that make its prefix: `vk_` and 8 of its random ones, enough
/// to tell real keys apart, too few to say much about one.
pub const PREFIX_CHARS: usize = 11;
/// Addresses and prefixes tracked at once each: past it the least used are forgotten, so the
/// throttle's memory is bounded whatever the traffic.
pub const MAX_TRACKED: u64 = 50_000;

/// A sign-in refused before its key was checked, and how long until one would be heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many failed sign-ins; retry after {retry_after_secs} s")]
pub struct Throttled {
    /// Whole seconds, at least 1 (for `Retry-After`).
    pub retry_after_secs: u32,
}

/// One address's or prefix's window: when it began, and the attempts not (yet) refunded.
struct Window {
    started: Instant,
    failures: AtomicU32,
}

impl Window {
    /// Seconds until this window ends, at least 1.
    fn retry_after_secs(&self) -> u32 {
        let left = WINDOW.saturating_sub(self.started.elapsed());
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
    }
}

/// Failed sign-ins by client address and by key prefix on this instance.
pub struct SignInThrottle {
    by_address: moka::sync::Cache<IpAddr, Arc<Window>>,
    by_prefix: moka::sync::Cache<String, Arc<Window>>,
}

impl Default for SignInThrottle {
    fn default() -> Self {
        Self::new()
    }
}

/// A sign-in counted as failed until [`Attempt::succeeded`] says otherwise: counted before the
/// key is checked, so concurrent guesses cannot all pass a check made before any was counted.
pub struct Attempt {
    windows: [Arc<Window>; 2],
}

impl Attempt {
    /// The sign-in was not a failed guess (it signed in, or the key was real): not counted.
    pub fn succeeded(self) {
        for w in &self.windows {
            w.failures.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl SignInThrottle {
    /// An empty throttle.
    pub fn new() -> Self {
        Self {
            by_address: bounded(),
            by_prefix: bounded(),
        }
    }

    /// Counts a sign-in from `address` with `key` as failed, unless the address or the key's
    /// prefix is out of failures for this window: then it is refused and not counted.
    pub fn attempt(&self, address: IpAddr, key: &str) -> Result<Attempt, Throttled> {
        let fresh = || {
            Arc::new(Window {
                started: Instant::now(),
                failures: AtomicU32::new(0),
            })
        };
        let windows = [
            (
                self.by_address.get_with(client(address), fresh),
                FAILURES_PER_ADDRESS,
            ),
            (
                self.by_prefix.get_with(prefix(key), fresh),
                FAILURES_PER_PREFIX,
            ),
        ];
        let mut refused = None;
        for (w, max) in &windows {
            if w.failures.fetch_add(1, Ordering::AcqRel) >= *max {
                let secs = w.retry_after_secs();
                refused = Some(refused.map_or(secs, |s: u32| s.max(secs)));
            }
        }
        let [(address, _), (prefix, _)] = windows;
        let attempt = Attempt {
            windows: [address, prefix],
        };
        match refused {
            Some(retry_after_secs) => {
                // A refused attempt checked nothing: it is not a failure.
                attempt.succeeded();
                Err(Throttled { retry_after_secs })
            }
            None => Ok(attempt),
        }
    }
}

/// A map of windows that holds at most [`MAX_TRACKED`] and drops each with its window (from
/// the window's first attempt).
fn bounded<K: std::hash::Hash + Eq + Send + Sync + 'static>() -> moka::sync::Cache<K, Arc<Window>> {
    moka::sync::Cache::builder()
        .max_capacity(MAX_TRACKED)
        .time_to_live(WINDOW)
        .build()
}

/// The address a client is counted under: an IPv6 client by its /64, which one subscriber
/// usually holds whole, so it cannot walk through fresh addresses.
fn client(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

/// The prefix a key is counted under: its first [`PREFIX_CHARS`] characters, so a stored
/// prefix is short whatever was posted.
fn prefix(key: &str) -> String {
    key.chars().take(PREFIX_CHARS).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failure_past_an_addresss_budget_is_refused_with_the_windows_wait() {
        let throttle = SignInThrottle::new();
        let address: IpAddr = "192.0.2.7".parse().unwrap();
        for n in 0..FAILURES_PER_ADDRESS {
            assert!(
                throttle.attempt(address, &format!("vk_{n:08}")).is_ok(),
                "failure {n} is heard"
            );
        }
        let refused = throttle.attempt(address, "vk_another1").err().unwrap();
        assert!((1..=300).contains(&refused.retry_after_secs), "{refused:?}");
        assert!(
            throttle
                .attempt("192.0.2.8".parse().unwrap(), "vk_another2")
                .is_ok(),
            "another address has its own budget"
        );
    }

    #[test]
    fn a_prefix_has_its_own_budget_from_every_address() {
        let throttle = SignInThrottle::new();
        for n in 0..FAILURES_PER_PREFIX {
            let address: IpAddr = format!("198.51.100.{n}").parse().unwrap();
            assert!(
                throttle
                    .attempt(address, &format!("vk_victim12-{n}"))
                    .is_ok()
            );
        }
        assert!(
            throttle
                .attempt("203.0.113.1".parse().unwrap(), "vk_victim12xyz")
                .is_err()
        );
        assert!(
            throttle
                .attempt("203.0.113.1".parse().unwrap(), "vk_other123")
                .is_ok()
        );
    }

    #[test]
    fn successes_and_refusals_use_no_budget() {
        let throttle = SignInThrottle::new();
        let address: IpAddr = "192.0.2.9".parse().unwrap();
        for _ in 0..100 {
            throttle
                .attempt(address, "vk_rightkey")
                .unwrap()
                .succeeded();
        }
        for _ in 0..FAILURES_PER_PREFIX {
            let _failed = throttle.attempt(address, "vk_wrongkey").unwrap();
        }
        for _ in 0..100 {
            assert!(throttle.attempt(address, "vk_wrongkey").is_err());
        }
        // The address spent only the prefix's failures; refusals did not count.
        for n in FAILURES_PER_PREFIX..FAILURES_PER_ADDRESS {
            let _failed = throttle.attempt(address, &format!("vk_{n:08}")).unwrap();
        }
        assert!(throttle.attempt(address, "vk_99999999").is_err());
    }

    #[test]
    fn ipv6_clients_count_by_their_64_and_prefixes_are_short() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(client(a), client(b));
        assert_ne!(client(a), client("2001:db8:1:3::1".parse().unwrap()));
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(client(mapped), "192.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(prefix(&"x".repeat(10_000)).len(), PREFIX_CHARS);
    }
}
