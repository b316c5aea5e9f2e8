//! Outbound callbacks: every attempt is made against a delivery already recorded in the outbox,
//! signed per Standard Webhooks, classified, and recorded; the worker retries what is due.
//!
//! - [`destination`]: which addresses a callback may reach.
//! - [`attempt`]: one signed POST and its classification.
//! - [`schedule`]: the state a delivery moves to after an attempt.
//! - [`worker`]: leases due deliveries and attempts them.

pub mod attempt;
pub mod destination;
pub mod schedule;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::clock::now_ms;
use crate::secrets::Keyring;
use crate::store::{AttemptRecord, DueDelivery, SecretPurpose, Store, StoreError};
use crate::tenant;
use attempt::Outgoing;
use schedule::{Trigger, Verdict};

/// How deliveries are made.
#[derive(Clone, Copy, Debug)]
pub struct DeliverySettings {
    /// The inline attempt's deadline (and every attempt's).
    pub deadline: Duration,
    /// Time between worker attempts.
    pub retry_interval: Duration,
    /// Whether loopback, private and link-local destinations are allowed.
    pub allow_private: bool,
}

/// How long a leased delivery is reserved for its attempt; longer than any deadline.
pub const LEASE: Duration = Duration::from_secs(60);

/// Makes and records delivery attempts.
pub struct Deliverer {
    client: reqwest::Client,
    store: Arc<dyn Store>,
    keys: Arc<Keyring>,
    settings: DeliverySettings,
}

impl Deliverer {
    /// Builds the HTTP client: no redirects, no proxies, guarded DNS unless private
    /// destinations are allowed.
    pub fn new(store: Arc<dyn Store>, keys: Arc<Keyring>, settings: DeliverySettings) -> Self {
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(settings.deadline)
            .user_agent(concat!("verdict/", env!("CARGO_PKG_VERSION")));
        if !settings.allow_private {
            builder = builder.dns_resolver(Arc::new(destination::GuardedResolver));
        }
        let client = builder.build().unwrap_or_else(|_| reqwest::Client::new());
        Self {
            client,
            store,
            keys,
            settings,
        }
    }

    /// The settings in force.
    pub fn settings(&self) -> DeliverySettings {
        self.settings
    }

    /// Attempts a leased delivery once and records the attempt.
    #[tracing::instrument(skip_all, fields(delivery_id = %due.id, trigger = trigger.as_str()))]
    pub async fn attempt(
        &self,
        due: &DueDelivery,
        trigger: Trigger,
    ) -> Result<Verdict, StoreError> {
        let secrets = tenant::live_secrets(
            &*self.store,
            &self.keys,
            due.tenant_id,
            SecretPurpose::Webhook,
        )
        .await
        .map_err(|e| match e {
            tenant::TenantError::Store(s) => s,
            other => StoreError::Corrupt(other.to_string()),
        })?;
        let attempt = match &due.callback_url {
            Some(url) => {
                attempt::send(
                    &self.client,
                    &Outgoing {
                        url,
                        webhook_id: &due.webhook_id,
                        payload: &due.payload,
                        secrets: &secrets,
                    },
                    self.settings.deadline,
                    self.settings.allow_private,
                )
                .await
            }
            None => attempt::Attempt {
                verdict: Verdict::Terminal,
                status_code: None,
                latency: Duration::ZERO,
                error: Some("no callback URL is configured".into()),
                excerpt: None,
            },
        };
        let now = now_ms();
        let next = schedule::next(
            &attempt.verdict,
            trigger,
            due.retries_left,
            now,
            self.settings.retry_interval,
        );
        self.store
            .record_attempt(&AttemptRecord {
                id: Uuid::now_v7(),
                delivery_id: due.id,
                tenant_id: due.tenant_id,
                attempted_at: now,
                trigger: trigger.as_str(),
                status_code: attempt.status_code.map(i32::from),
                latency_ms: i64::try_from(attempt.latency.as_millis()).unwrap_or(i64::MAX),
                error: attempt.error.clone(),
                response_excerpt: attempt.excerpt.clone(),
                next,
            })
            .await?;
        metrics::counter!("verdict_delivery_attempts_total", "outcome" => outcome_label(&attempt.verdict))
            .increment(1);
        metrics::histogram!("verdict_delivery_latency_seconds")
            .record(attempt.latency.as_secs_f64());
        tracing::info!(
            status = attempt.status_code,
            latency_ms = attempt.latency.as_millis() as u64,
            outcome = outcome_label(&attempt.verdict),
            "delivery attempted"
        );
        Ok(attempt.verdict)
    }

    /// Resets a delivery for another round and attempts it now, with the same `webhook-id`.
    pub async fn redeliver(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<Verdict>, StoreError> {
        let now = now_ms();
        let Some(due) = self
            .store
            .lease_for_redelivery(tenant_id, id, now, now + lease_ms(), schedule::MAX_RETRIES)
            .await?
        else {
            return Ok(None);
        };
        self.attempt(&due, Trigger::Redeliver).await.map(Some)
    }
}

/// The lease in store units.
pub fn lease_ms() -> i64 {
    i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX)
}

fn outcome_label(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Delivered => "delivered",
        Verdict::Retryable { .. } => "retryable",
        Verdict::Terminal => "terminal",
        Verdict::Gone => "gone",
    }
}
