//! Each tenant's quota of events stored a day (UTC): a bound a real tenant does not meet, so one
//! tenant's key cannot fill the database for everyone.
//!
//! Checking it costs the signal path no round trip: each instance counts the events it stores
//! in memory, and every few seconds adds its counts to `tenant_usage` and reads back every
//! tenant's sum for the day. A tenant at its quota is refused (429 `quota-exceeded`, retry at
//! the next UTC midnight) before anything is claimed. The sums are at most one interval old, so
//! a tenant can pass its quota by what it stores in one interval on each instance, no more.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::store::usage::UsageStore;
use crate::store::{StoreError, TenantRecord};

const DAY_MS: i64 = 86_400_000;

/// A tenant at its quota of events for the day, and how long until the day ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant stored its {max} events for today (UTC); retry after {retry_after_secs} s")]
pub struct QuotaExceeded {
    pub max: u64,
    /// Whole seconds until the next UTC midnight, at least 1.
    pub retry_after_secs: u32,
}

/// The quota and what this instance knows of each tenant's day.
pub struct DailyQuota {
    max: Option<NonZeroU64>,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    /// The day the counts are for (days since the Unix epoch).
    day: i64,
    /// Stored here and not yet added to the table.
    pending: HashMap<Uuid, u64>,
    /// Every instance's sum as last read.
    totals: HashMap<Uuid, u64>,
}

impl DailyQuota {
    /// A quota of `max` events per tenant a day; `None`: unlimited.
    pub fn new(max: Option<NonZeroU64>) -> Self {
        Self {
            max,
            counts: Mutex::new(Counts {
                day: today(now_ms()),
                ..Counts::default()
            }),
        }
    }

    /// Refuses a tenant at its quota for today.
    pub fn admit(&self, tenant: &TenantRecord) -> Result<(), QuotaExceeded> {
        let Some(max) = self.max else {
            return Ok(());
        };
        let now = now_ms();
        let mut counts = self.counts();
        counts.roll_to(today(now));
        let total = counts.totals.get(&tenant.id).copied().unwrap_or(0)
            + counts.pending.get(&tenant.id).copied().unwrap_or(0);
        if total < max.get() {
            return Ok(());
        }
        let left_ms = (today(now) + 1) * DAY_MS - now;
        Err(QuotaExceeded {
            max: max.get(),
            retry_after_secs: u32::try_from(((left_ms + 999) / 1000).max(1)).unwrap_or(u32::MAX),
        })
    }

    /// Counts one event stored for the tenant.
    pub fn stored(&self, tenant_id: Uuid) {
        if self.max.is_none() {
            return;
        }
        let mut counts = self.counts();
        counts.roll_to(today(now_ms()));
        *counts.pending.entry(tenant_id).or_insert(0) += 1;
    }

    /// Adds this instance's counts to the table and reads every tenant's sum back. Counts
    /// that could not be added are kept for the next time.
    pub async fn sync(&self, store: &(dyn UsageStore + Send + Sync)) -> Result<(), StoreError> {
        if self.max.is_none() {
            return Ok(());
        }
        let (day, pending) = {
            let mut counts = self.counts();
            counts.roll_to(today(now_ms()));
            (counts.day, std::mem::take(&mut counts.pending))
        };
        let adding: Vec<(Uuid, i64)> = pending
            .iter()
            .map(|(t, n)| (*t, i64::try_from(*n).unwrap_or(i64::MAX)))
            .collect();
        if let Err(err) = store.add_usage(day, &adding).await {
            let mut counts = self.counts();
            if counts.day == day {
                for (tenant, n) in pending {
                    *counts.pending.entry(tenant).or_insert(0) += n;
                }
            }
            return Err(err);
        }
        let totals = store.usage_on(day).await?;
        let mut counts = self.counts();
        if counts.day == day {
            counts.totals = totals
                .into_iter()
                .map(|(t, n)| (t, u64::try_from(n).unwrap_or(0)))
                .collect();
        }
        Ok(())
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Counts {
    /// Starts a new day's counts when `day` is past theirs.
    fn roll_to(&mut self, day: i64) {
        if day > self.day {
            *self = Counts {
                day,
                ..Counts::default()
            };
        }
    }
}

/// Days since the Unix epoch (UTC) at `ms`.
fn today(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// Syncs `quota` every `every` until `stop`, and prunes the days before yesterday.
pub async fn run(
    quota: std::sync::Arc<DailyQuota>,
    store: std::sync::Arc<dyn UsageStore + Send + Sync>,
    every: Duration,
    stop: CancellationToken,
) {
    if quota.max.is_none() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(err) = quota.sync(&*store).await {
            tracing::warn!(error = ?err, "could not sync the daily event quota's counts");
        }
        if let Err(err) = store.prune_usage(today(now_ms()) - 1).await {
            tracing::warn!(error = ?err, "could not prune old daily event counts");
        }
    }
    // What this instance stored since the last sync still counts for the others.
    if let Err(err) = quota.sync(&*store).await {
        tracing::warn!(error = ?err, "could not sync the daily event quota's counts");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant() -> TenantRecord {
        TenantRecord {
            id: Uuid::now_v7(),
            name: "t".into(),
            inbound_signature_required: false,
            inbound_signature_covers_key: false,
            callback_url: None,
            callback_disabled: false,
            rate_limit_per_second: None,
            created_at: 0,
        }
    }

    #[test]
    fn a_tenant_is_refused_at_its_quota_with_the_time_to_midnight() {
        let quota = DailyQuota::new(NonZeroU64::new(2));
        let (t, other) = (tenant(), tenant());
        quota.admit(&t).unwrap();
        quota.stored(t.id);
        quota.stored(t.id);
        let refused = quota.admit(&t).unwrap_err();
        assert_eq!(refused.max, 2);
        assert!((1..=86_400).contains(&refused.retry_after_secs));
        quota.admit(&other).unwrap();
        assert!(DailyQuota::new(None).admit(&t).is_ok());
    }

    #[test]
    fn a_new_day_starts_from_nothing() {
        let mut counts = Counts {
            day: 10,
            ..Counts::default()
        };
        counts.pending.insert(Uuid::now_v7(), 5);
        counts.roll_to(11);
        assert!(counts.pending.is_empty() && counts.day == 11);
    }
}
