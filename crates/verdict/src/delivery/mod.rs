//! Outbound callbacks: every attempt is made against a delivery already recorded in the outbox,
//! signed per Standard Webhooks, classified, and recorded; the worker retries what is due.
//!
//! - [`destination`] (a module of its own: tenants and the feeds check URLs with it too): which
//!   addresses a callback may reach.
//! - [`attempt`]: one signed POST and its classification.
//! - [`schedule`]: the state a delivery moves to after an attempt.
//! - [`worker`]: leases due deliveries and attempts them.
//! - [`resolve`]: an operator settles an action request whose outcome is `unknown`.

pub mod attempt;
pub mod connector;
pub mod resolve;
pub mod schedule;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;
use uuid::Uuid;

use crate::clock::now_ms;
use crate::connectors::request;
use crate::destination;
use crate::domain::{ActionResult, Guarantee, Outcome};
use crate::endpoints;
use crate::secrets::Keyring;
use crate::store::failpoint::failpoint;
use crate::store::{
    AttemptRecord, ConnectorRecord, DueDelivery, Redelivery, SecretPurpose, StoreError,
};
use crate::telemetry;
use crate::tenant;
use attempt::Outgoing;
use schedule::Trigger;
pub use schedule::{AttemptOutcome, DeliveryStatus};

/// How deliveries are made.
#[derive(Clone, Copy, Debug)]
pub struct DeliverySettings {
    /// The inline attempt's deadline (and every attempt's).
    pub deadline: Duration,
    /// Time between worker attempts.
    pub retry_interval: Duration,
    /// Which non-public destinations are allowed.
    pub destinations: destination::DestinationPolicy,
}

/// The longest attempt deadline configuration accepts. Bounding it bounds every lease.
pub const MAX_DEADLINE: Duration = Duration::from_secs(30);

/// What a lease allows beyond the sends themselves: reading the tenant's secrets before the
/// send and recording the attempt after it (the response excerpt is read within the deadline).
pub const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// How long `batch` leased deliveries, attempted `concurrency` at a time, each send given up at
/// `deadline`, are reserved: longer than the batch can take, so no other worker (or lease
/// expiry) can take a delivery back while its attempt may still be running. Each attempt holds
/// a slot for at most `deadline` plus its bookkeeping; a delivery waits for at most
/// `ceil(batch / concurrency) - 1` attempts ahead of it in its slot.
pub fn lease_for(deadline: Duration, batch: usize, concurrency: usize) -> Duration {
    let waves = batch.div_ceil(concurrency.max(1)).max(1);
    (deadline + LEASE_MARGIN).saturating_mul(u32::try_from(waves).unwrap_or(u32::MAX))
}

/// The lease of an inline attempt (one send, any deadline configuration allows).
pub const LEASE: Duration = Duration::from_secs(60);
const _: () = assert!(LEASE.as_secs() >= MAX_DEADLINE.as_secs() + LEASE_MARGIN.as_secs());
// A pending listing looks this far back for deliveries still under the lease they were made with.
const _: () =
    assert!(crate::store::deliveries::UNSWEPT_SPAN_MS as u64 >= LEASE.as_millis() as u64 + 60_000);

impl DeliverySettings {
    /// The lease of one send under these settings.
    pub fn lease(&self) -> Duration {
        lease_for(self.deadline, 1, 1)
    }
}

/// The callback HTTP client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the guarded HTTP client for callbacks")]
pub struct ClientError(#[source] reqwest::Error);

/// The client every attempt goes through: redirects off, proxies off (a proxy would resolve
/// names where the guard cannot see), and the destination guard as its resolver.
fn http_client(settings: &DeliverySettings) -> Result<reqwest::Client, ClientError> {
    guarded_client(settings.destinations, settings.deadline)
}

/// A client under the destination guard (no redirects, no proxies, every resolved address
/// checked against `policy`): callbacks use it, and so does any other fetch of a URL a tenant
/// configured (a SET transmitter's JWKS).
pub fn guarded_client(
    policy: destination::DestinationPolicy,
    connect_timeout: Duration,
) -> Result<reqwest::Client, ClientError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(connect_timeout)
        .user_agent(concat!("verdict/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(destination::GuardedResolver::new(policy)))
        .build()
        .map_err(ClientError)
}

/// At most one manual redelivery per delivery within this interval: a receiver is not to be
/// hammered by hand. Judged from the redeliver attempts recorded in the database, so it holds
/// across instances.
pub const REDELIVER_INTERVAL: Duration = Duration::from_secs(10);

/// What a request to redeliver did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redelivered {
    /// Attempted now.
    Attempted(AttemptOutcome),
    /// Redelivered too recently; allowed again after this wait.
    TooSoon(Duration),
    /// An attempt is in progress or the tenant's endpoint is disabled (or no such delivery).
    Unavailable,
}

pub use crate::store::ports::DeliveryPort;

/// Makes and records delivery attempts.
pub struct Deliverer {
    client: reqwest::Client,
    store: Arc<dyn DeliveryPort>,
    /// Opens connectors' credentials and the sealed action requests.
    keys: Arc<Keyring>,
    /// Connectors as read, for at most [`CONNECTOR_TTL`]: a signal's calls read none.
    connectors: moka::future::Cache<(Uuid, String), Arc<ConnectorRecord>>,
    /// Webhook secrets, opened and cached for at most 5 s (a rotation applies within that).
    credentials: tenant::Credentials,
    settings: DeliverySettings,
}

impl Deliverer {
    /// Builds the HTTP client: no redirects, no proxies, and the guarded resolver whatever the
    /// settings (they decide what it lets through). A client that cannot be built this way is
    /// an error: there is no unguarded fallback.
    pub fn new(
        store: Arc<dyn DeliveryPort>,
        keys: Arc<Keyring>,
        settings: DeliverySettings,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            client: http_client(&settings)?,
            credentials: tenant::Credentials::new(store.clone(), keys.clone()),
            keys,
            connectors: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(CONNECTOR_TTL)
                .build(),
            store,
            settings,
        })
    }

    /// The settings in force.
    pub fn settings(&self) -> DeliverySettings {
        self.settings
    }

    /// Attempts a leased delivery once, now, and records the attempt; a retry is scheduled from
    /// now (the attempt's start).
    pub async fn attempt(
        &self,
        due: &DueDelivery,
        trigger: Trigger,
    ) -> Result<AttemptOutcome, StoreError> {
        self.attempt_due_at(due, trigger, now_ms()).await
    }

    /// Attempts a leased delivery once and records the attempt; a retry is scheduled from
    /// `due_at` (a worker round's scheduled time), not from when the send ended, so it is due
    /// by the next round.
    ///
    /// Its `delivery` span is a worker attempt's root span: the request that stored the
    /// delivery is long gone, so a retry's trace is its own.
    #[tracing::instrument(name = "delivery", skip_all, fields(delivery_id = %due.id, trigger = trigger.as_str()))]
    pub async fn attempt_due_at(
        &self,
        due: &DueDelivery,
        trigger: Trigger,
        due_at: i64,
    ) -> Result<AttemptOutcome, StoreError> {
        let (attempt, record) = self.send(due, trigger, due_at).await?;
        self.store.record_attempt(&record).await?;
        observe(&attempt);
        if record.next.status == DeliveryStatus::Dead {
            // A dead letter waits for an operator: say so where alerts look.
            metrics::counter!("verdict_deliveries_dead_total").increment(1);
            tracing::warn!(delivery_id = %due.id, tenant_id = %due.tenant_id,
                last_error = record.error.as_deref().unwrap_or(""),
                "delivery is dead: its retries ran out; redeliver it once the receiver is back");
        }
        Ok(attempt.outcome)
    }

    /// Sends a leased delivery once: a callback signed with the tenant's live webhook
    /// secrets, or an action request to its connector. Returns what happened and the record
    /// to store (the caller stores it, alone or in a group commit, then calls [`observe`]).
    pub async fn send(
        &self,
        due: &DueDelivery,
        trigger: Trigger,
        due_at: i64,
    ) -> Result<(attempt::Attempt, AttemptRecord), StoreError> {
        let started = now_ms();
        let attempt = if due.action == CALLBACK {
            self.send_callback(due).await?
        } else {
            self.send_request(due).await?
        };
        let next = schedule::next(
            &attempt.outcome,
            trigger,
            due.retries_left,
            due_at.min(started),
            self.settings.retry_interval,
        );
        let record = AttemptRecord {
            id: Uuid::now_v7(),
            delivery_id: due.id,
            tenant_id: due.tenant_id,
            attempted_at: started,
            trigger: trigger.as_str(),
            status_code: attempt.status_code.map(i32::from),
            latency_ms: i64::try_from(attempt.latency.as_millis()).unwrap_or(i64::MAX),
            error: attempt.error.clone(),
            response_excerpt: attempt.excerpt.clone(),
            next,
        };
        Ok((attempt, record))
    }

    /// A callback attempt: the stored envelope, signed with its endpoint's own secret, or the
    /// tenant's webhook secrets for the `default` endpoint.
    async fn send_callback(&self, due: &DueDelivery) -> Result<attempt::Attempt, StoreError> {
        let webhook_id = due.webhook_id();
        let secrets = match (&due.endpoint_secret, &due.endpoint_name) {
            (Some(sealed), Some(name)) => {
                let opened = name.parse().ok().and_then(|name| {
                    endpoints::own_secret(&self.keys, due.tenant_id, &name, sealed).ok()
                });
                // What cannot be opened never will be: a terminal failure, not a retry.
                let Some(secret) = opened else {
                    tracing::error!("an endpoint's secret does not open under this master key");
                    return Ok(not_sent(
                        AttemptOutcome::Terminal,
                        "the endpoint's secret does not open under this master key",
                    ));
                };
                vec![secret]
            }
            _ => self
                .credentials
                .secrets(due.tenant_id, SecretPurpose::Webhook, false)
                .await
                .map_err(|e| match e {
                    tenant::TenantError::Store(s) => s,
                    other => StoreError::Corrupt(Box::new(other)),
                })?,
        };
        Ok(match &due.callback_url {
            Some(url) => {
                let span = telemetry::span!(
                    "callback",
                    otel.kind = "client",
                    event_id = %due.event_id,
                    delivery_id = %due.id,
                    webhook_id = %webhook_id,
                );
                let attempt = attempt::send(
                    &self.client,
                    &Outgoing {
                        url,
                        webhook_id: &webhook_id,
                        payload: &due.payload,
                        secrets: &secrets,
                    },
                    self.settings.deadline,
                    self.settings.destinations,
                )
                .instrument(span.clone())
                .await;
                record_on(&span, &attempt);
                attempt
            }
            None => not_sent(AttemptOutcome::Terminal, "no callback URL is configured"),
        })
    }

    /// The tenant's connector `name`, cached.
    async fn connector(
        &self,
        tenant_id: Uuid,
        name: Option<&str>,
    ) -> Result<Option<Arc<ConnectorRecord>>, StoreError> {
        let Some(name) = name.and_then(|n| n.parse::<crate::domain::ConnectorName>().ok()) else {
            return Ok(None);
        };
        let key = (tenant_id, name.to_string());
        if let Some(found) = self.connectors.get(&key).await {
            return Ok(Some(found));
        }
        let found = self.store.connector(tenant_id, &name).await?.map(Arc::new);
        if let Some(found) = &found {
            self.connectors.insert(key, found.clone()).await;
        }
        Ok(found)
    }

    /// An action request's call: the stored request, opened, to the tenant's connector.
    async fn send_request(&self, due: &DueDelivery) -> Result<attempt::Attempt, StoreError> {
        let webhook_id = due.webhook_id();
        let connector = self
            .connector(due.tenant_id, due.connector.as_deref())
            .await?;
        let Some(connector) = connector else {
            return Ok(not_sent(
                AttemptOutcome::Terminal,
                "the connector was deleted",
            ));
        };
        // What cannot be opened never will be: a terminal failure, not a retry every round.
        let Ok(credential) = crate::connectors::credential(&self.keys, &connector) else {
            tracing::error!("a connector's credential does not open under this master key");
            return Ok(not_sent(
                AttemptOutcome::Terminal,
                "the connector's credential does not open under this master key",
            ));
        };
        let body = match request::open(&self.keys, &due.payload, due.event_id, &due.action) {
            Ok(body) => body,
            Err(request::OpenError::Erased) => {
                return Ok(not_sent(
                    AttemptOutcome::Terminal,
                    "the request was erased once its outcome was final",
                ));
            }
            Err(err) => {
                tracing::error!(error = ?err, "a stored action request does not open");
                return Ok(not_sent(
                    AttemptOutcome::Terminal,
                    "the stored request does not open under this master key",
                ));
            }
        };
        let Ok(parsed) = serde_json::from_slice::<request::ActionRequest>(&body) else {
            return Ok(not_sent(
                AttemptOutcome::Terminal,
                "the stored request is not an action request",
            ));
        };
        let call = connector::Call {
            connector: &connector,
            credential: &credential,
            key: &webhook_id,
            body: &body,
            request: &parsed,
        };
        // The three points a crash can meet a call at: before it, during it (the receiver
        // has it, the answer never comes back), and after it before its record.
        failpoint!("connector::before_call");
        // An at-most-once connector's request is marked sent, durably, before the first byte
        // leaves. Found marked, a call was sent and its outcome never recorded (a crash
        // between them): it may have acted, so it is not made again.
        if connector.guarantee == Guarantee::AtMostOnce
            && !self.store.mark_sent(due.id, now_ms()).await?
        {
            tracing::warn!(
                "an at-most-once call was sent before and its outcome never recorded; \
                 not calling again, the outcome is unknown"
            );
            return Ok(not_sent(AttemptOutcome::Unknown, SENT_BEFORE));
        }
        let span = telemetry::span!(
            "connector_call",
            otel.kind = "client",
            event_id = %due.event_id,
            delivery_id = %due.id,
            action = %due.action,
            connector = %connector.name,
            connector_kind = connector.kind.as_str(),
            webhook_id = %webhook_id,
        );
        let attempt = connector::call(
            &self.client,
            &call,
            self.settings.deadline,
            self.settings.destinations,
        )
        .instrument(span.clone())
        .await;
        record_on(&span, &attempt);
        failpoint!("connector::after_call");
        Ok(attempt)
    }

    /// Resets a delivery for another round and attempts it now, with the same `webhook-id`; at
    /// most once per [`REDELIVER_INTERVAL`] per delivery.
    pub async fn redeliver(&self, tenant_id: Uuid, id: Uuid) -> Result<Redelivered, StoreError> {
        let now = now_ms();
        let lease = i64::try_from(self.settings.lease().as_millis()).unwrap_or(i64::MAX);
        let interval = i64::try_from(REDELIVER_INTERVAL.as_millis()).unwrap_or(i64::MAX);
        let leased = self
            .store
            .lease_for_redelivery(
                tenant_id,
                id,
                now,
                now.saturating_add(lease),
                schedule::MAX_RETRIES,
                now.saturating_sub(interval),
            )
            .await?;
        match leased {
            Redelivery::Leased(due) => self
                .attempt(&due, Trigger::Redeliver)
                .await
                .map(Redelivered::Attempted),
            Redelivery::TooSoon { last } => {
                let wait = last.saturating_add(interval).saturating_sub(now).max(1);
                Ok(Redelivered::TooSoon(Duration::from_millis(
                    wait.unsigned_abs(),
                )))
            }
            Redelivery::Unavailable => Ok(Redelivered::Unavailable),
        }
    }
}

/// An event's action outcomes as stored with it, with each connector call that was still open
/// then (`pending`, or `unknown` until an operator resolves it) replaced by where its request
/// (among `deliveries`, the event's) stands now: the final state once the worker or an operator
/// settled it.
pub fn current_outcomes(
    mut results: Vec<ActionResult>,
    deliveries: &[crate::store::DeliveryRecord],
) -> Vec<ActionResult> {
    for result in &mut results {
        if result.connector.is_none()
            || !matches!(result.outcome, Outcome::Pending | Outcome::Unknown)
        {
            continue;
        }
        if let Some(d) = deliveries
            .iter()
            .find(|d| d.action == result.action.as_str())
        {
            result.outcome = Outcome::of_request(d.status, d.last_error.as_deref());
        }
    }
    results
}

/// How long a connector's settings, once read, are used: a change reaches every instance's
/// calls within this.
pub const CONNECTOR_TTL: Duration = Duration::from_secs(5);

/// Why an at-most-once connector's request was not called again.
pub const SENT_BEFORE: &str = "not called again: an earlier call was sent and its outcome \
     never recorded (it may have acted); an operator resolves it";

/// The `action` of a callback delivery.
pub const CALLBACK: &str = "callback";

/// An attempt not made, for `why`.
fn not_sent(outcome: AttemptOutcome, why: &str) -> attempt::Attempt {
    attempt::Attempt {
        outcome,
        status_code: None,
        latency: Duration::ZERO,
        error: Some(why.to_owned()),
        excerpt: None,
        already_done: false,
        sent: false,
    }
}

/// Records an attempt's answer on its span (traces only).
fn record_on(span: &tracing::Span, attempt: &attempt::Attempt) {
    let delivered = attempt.outcome == AttemptOutcome::Delivered;
    telemetry::record_call(
        span,
        attempt.status_code,
        outcome_label(&attempt.outcome),
        delivered,
    );
}

/// Counts and logs a recorded attempt.
pub fn observe(attempt: &attempt::Attempt) {
    metrics::counter!("verdict_delivery_attempts_total", "outcome" => outcome_label(&attempt.outcome))
        .increment(1);
    metrics::histogram!("verdict_delivery_latency_seconds").record(attempt.latency.as_secs_f64());
    tracing::info!(
        status = attempt.status_code,
        latency_ms = attempt.latency.as_millis() as u64,
        outcome = outcome_label(&attempt.outcome),
        "delivery attempted"
    );
}

/// The inline attempt's lease in store units.
pub fn lease_ms() -> i64 {
    i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX)
}

fn outcome_label(outcome: &AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Delivered => "delivered",
        AttemptOutcome::Retryable { .. } => "retryable",
        AttemptOutcome::Terminal => "terminal",
        AttemptOutcome::Gone => "gone",
        AttemptOutcome::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_outlasts_everything_its_batch_can_take() {
        let ms = Duration::from_millis;
        for deadline in [ms(1), ms(5000), ms(15_000), MAX_DEADLINE] {
            for (batch, concurrency) in [(1usize, 1usize), (16, 16), (64, 16), (65, 16), (10, 3)] {
                let waves = u32::try_from(batch.div_ceil(concurrency)).unwrap();
                let lease = lease_for(deadline, batch, concurrency);
                assert!(
                    lease > deadline * waves,
                    "{batch}/{concurrency} at {deadline:?}: {lease:?}"
                );
                assert!(lease >= (deadline + LEASE_MARGIN) * waves);
            }
        }
        // The case of issue 8: a 15 s deadline, 64 leased, 16 at a time, took up to 60 s of
        // sends against a fixed 60 s lease.
        assert!(lease_for(ms(15_000), 64, 16) > Duration::from_secs(60));
        assert_eq!(lease_for(ms(15_000), 64, 16), Duration::from_secs(180));
    }

    #[test]
    fn the_inline_lease_covers_one_send_at_the_longest_deadline() {
        assert!(LEASE >= lease_for(MAX_DEADLINE, 1, 1));
        assert_eq!(i64::try_from(LEASE.as_millis()).unwrap(), lease_ms());
    }
}
