//! Per-tenant rate limits: a GCRA limiter per tenant (governor), `N` requests per second with a
//! burst of `N`, from the tenant's own setting or else the server's.
//!
//! Limits are per instance: with several instances behind a balancer, a tenant's budget is
//! `N` on each. Deciding needs no database round trip: the tenant's own setting arrives with
//! its cached key grant.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota};
use uuid::Uuid;

use crate::store::TenantRecord;

/// Tenants whose limiter state is held at once; the least recently used beyond it start over
/// with a full burst.
const MAX_TENANTS: u64 = 100_000;

/// A limiter unused this long is dropped: by then it has refilled, so nothing is lost.
const IDLE: Duration = Duration::from_secs(600);

/// A request over its tenant's limit, and how long until one would be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant's rate limit is exceeded; retry after {retry_after_secs} s")]
pub struct RateLimited {
    /// Whole seconds, at least 1 (for `Retry-After`).
    pub retry_after_secs: u32,
}

/// One tenant's limiter and the rate it was built for.
struct TenantLimiter {
    per_second: NonZeroU32,
    limiter: DefaultDirectRateLimiter,
}

/// Every tenant's limiter on this instance.
pub struct RateLimits {
    /// The server's setting; `None`: tenants without their own limit are unlimited.
    default_per_second: Option<NonZeroU32>,
    limiters: moka::sync::Cache<Uuid, Arc<TenantLimiter>>,
    clock: DefaultClock,
}

impl RateLimits {
    /// Limits with the server's setting (`None`: unlimited unless a tenant sets its own).
    pub fn new(default_per_second: Option<NonZeroU32>) -> Self {
        Self {
            default_per_second,
            limiters: moka::sync::Cache::builder()
                .max_capacity(MAX_TENANTS)
                .time_to_idle(IDLE)
                .build(),
            clock: DefaultClock::default(),
        }
    }

    /// The rate that applies to a tenant: its own, else the server's.
    pub fn rate_for(&self, tenant: &TenantRecord) -> Option<NonZeroU32> {
        tenant
            .rate_limit_per_second
            .and_then(|n| u32::try_from(n).ok())
            .and_then(NonZeroU32::new)
            .or(self.default_per_second)
    }

    /// Admits one request of `tenant`, or says how long until one would be admitted. A refused
    /// request uses up nothing.
    pub fn admit(&self, tenant: &TenantRecord) -> Result<(), RateLimited> {
        let Some(per_second) = self.rate_for(tenant) else {
            return Ok(());
        };
        let build = || {
            Arc::new(TenantLimiter {
                per_second,
                limiter: DefaultDirectRateLimiter::direct(Quota::per_second(per_second)),
            })
        };
        let mut entry = self.limiters.get_with(tenant.id, build);
        if entry.per_second != per_second {
            // The tenant's setting changed: start over at the new rate.
            entry = build();
            self.limiters.insert(tenant.id, entry.clone());
        }
        entry.limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            RateLimited {
                retry_after_secs: whole_seconds(wait),
            }
        })
    }
}

/// A wait as whole seconds for `Retry-After`, rounded up, at least 1.
fn whole_seconds(wait: Duration) -> u32 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(rate: Option<i64>) -> TenantRecord {
        TenantRecord {
            id: Uuid::now_v7(),
            name: "t".into(),
            inbound_signature_required: false,
            inbound_signature_covers_key: false,
            callback_url: None,
            callback_disabled: false,
            rate_limit_per_second: rate,
            created_at: 0,
        }
    }

    #[test]
    fn unlimited_without_any_setting() {
        let limits = RateLimits::new(None);
        let t = tenant(None);
        assert!((0..1000).all(|_| limits.admit(&t).is_ok()));
    }

    #[test]
    fn a_burst_of_the_rate_is_admitted_then_refused_with_a_whole_second_wait() {
        let limits = RateLimits::new(NonZeroU32::new(5));
        let t = tenant(None);
        assert!((0..5).all(|_| limits.admit(&t).is_ok()));
        let refused = limits.admit(&t).unwrap_err();
        assert_eq!(refused.retry_after_secs, 1);
        // Another tenant has its own budget.
        assert!(limits.admit(&tenant(None)).is_ok());
    }

    #[test]
    fn the_tenants_own_rate_wins_over_the_servers() {
        let limits = RateLimits::new(NonZeroU32::new(100));
        let t = tenant(Some(2));
        assert!(limits.admit(&t).is_ok() && limits.admit(&t).is_ok());
        assert!(limits.admit(&t).is_err());
        let raised = TenantRecord {
            rate_limit_per_second: Some(50),
            ..t
        };
        assert!(
            (0..50).all(|_| limits.admit(&raised).is_ok()),
            "a changed setting starts over at the new rate"
        );
    }

    #[test]
    fn the_default_admits_a_burst_of_1000_and_refuses_past_it() {
        let default = crate::config::RateLimitArgs::default().resolve(&Default::default());
        let limits = RateLimits::new(default);
        let t = tenant(None);
        // At most a few tokens refill while the loop runs (one a millisecond).
        let admitted = (0..1_100).filter(|_| limits.admit(&t).is_ok()).count();
        assert!((1_000..1_050).contains(&admitted), "{admitted} admitted");
    }

    #[test]
    fn waits_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(200)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(3)), 3);
    }
}
