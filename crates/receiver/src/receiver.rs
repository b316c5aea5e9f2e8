//! The checklist in order: authenticate the raw bytes, parse, deduplicate and record, then
//! (after the caller has answered 2xx) process, and recover what a crash left unprocessed.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use uuid::Uuid;
use verdict_webhooks::{
    DEFAULT_TOLERANCE_SECS, Envelope, HEADER_ID, HEADER_SIGNATURE, Headers, Secret, Verifier,
};

use crate::store::{DedupStore, Record, RecordOutcome, TupleDigest};
use crate::{Event, Handler, ReceiveError};

/// How long ids and tuples are remembered: 72 hours.
///
/// It must outlast every way verdict can send one event again. Its retry schedule is short (one
/// inline attempt, then by default 3 worker attempts 5 minutes apart: about 20 minutes, longer
/// when a `Retry-After` asks for it), but an operator can redeliver a dead delivery by hand, with
/// the same `webhook-id`, hours or a weekend later. 72 hours covers both with margin.
///
/// Only processed records expire; an event whose handler has not yet succeeded is kept (and
/// still deduplicates) until it has, since dropping it would lose the event.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(72 * 3600);

/// How long a handler holds an event before recovery may hand it to another: 5 minutes.
pub const DEFAULT_HANDLER_LEASE: Duration = Duration::from_secs(5 * 60);

/// How often the axum integration runs a recovery pass: every minute.
pub const DEFAULT_RECOVERY_INTERVAL: Duration = Duration::from_secs(60);

/// How often expired records are pruned, opportunistically during `receive`: hourly.
pub const DEFAULT_PRUNE_INTERVAL: Duration = Duration::from_secs(3600);

/// The largest body accepted by default: 1 MiB. verdict's envelopes are a few KiB; the limit is
/// what a receiver buffers, verifies and stores for anyone who can reach it.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// Records leased per recovery batch; small, so a batch finishes well inside its lease.
const RECOVERY_BATCH: u32 = 16;

/// What [`Receiver::receive`] made of a delivery; both answers are 2xx.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per delivery and destructured at once; a box would only add an allocation"
)]
pub enum Received {
    /// First delivery: recorded; answer 2xx, then process it (see [`Receiver::process`]).
    New(Event),
    /// Already recorded within the horizon: answer 2xx and discard it.
    Duplicate,
}

/// What a recovery pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Events the handler finished.
    pub handled: usize,
    /// Events whose handler failed again; they stay pending for a later pass.
    pub failed: usize,
}

/// Verifies, deduplicates and records verdict callbacks; cheap to clone.
#[derive(Clone)]
pub struct Receiver {
    inner: Arc<Inner>,
}

struct Inner {
    verifier: Verifier,
    store: Arc<dyn DedupStore>,
    allow_unsigned: bool,
    horizon_ms: i64,
    lease_ms: i64,
    recovery_interval: Duration,
    prune_interval_ms: i64,
    last_prune_ms: AtomicI64,
    max_body_bytes: usize,
}

/// Configures a [`Receiver`].
pub struct ReceiverBuilder {
    store: Arc<dyn DedupStore>,
    secrets: Vec<Secret>,
    tolerance: Duration,
    horizon: Duration,
    lease: Duration,
    recovery_interval: Duration,
    prune_interval: Duration,
    allow_unsigned: bool,
    max_body_bytes: usize,
}

impl ReceiverBuilder {
    /// Adds a signing secret (`whsec_…`); add the old and the new one during rotation.
    pub fn secret(mut self, secret: Secret) -> ReceiverBuilder {
        self.secrets.push(secret);
        self
    }

    /// Adds several signing secrets.
    pub fn secrets(mut self, secrets: impl IntoIterator<Item = Secret>) -> ReceiverBuilder {
        self.secrets.extend(secrets);
        self
    }

    /// Allowed clock skew on `webhook-timestamp`, both ways; default 300 s.
    pub fn tolerance(mut self, tolerance: Duration) -> ReceiverBuilder {
        self.tolerance = tolerance;
        self
    }

    /// How long ids and tuples are remembered; default [`DEFAULT_HORIZON`], at least twice the tolerance.
    pub fn horizon(mut self, horizon: Duration) -> ReceiverBuilder {
        self.horizon = horizon;
        self
    }

    /// How long a running handler holds its event; default [`DEFAULT_HANDLER_LEASE`].
    ///
    /// Longer than the slowest handler run, or recovery may start a second run alongside it.
    pub fn handler_lease(mut self, lease: Duration) -> ReceiverBuilder {
        self.lease = lease;
        self
    }

    /// How often the axum integration runs a recovery pass; default [`DEFAULT_RECOVERY_INTERVAL`].
    pub fn recovery_interval(mut self, interval: Duration) -> ReceiverBuilder {
        self.recovery_interval = interval;
        self
    }

    /// How often `receive` prunes expired records; default [`DEFAULT_PRUNE_INTERVAL`].
    pub fn prune_interval(mut self, interval: Duration) -> ReceiverBuilder {
        self.prune_interval = interval;
        self
    }

    /// The largest body accepted, in bytes; default [`DEFAULT_MAX_BODY_BYTES`] (1 MiB).
    ///
    /// A larger body is refused before its signature is checked; the axum integration refuses
    /// it with a 413 without buffering more than the limit.
    pub fn max_body_bytes(mut self, limit: usize) -> ReceiverBuilder {
        self.max_body_bytes = limit;
        self
    }

    /// **Dangerous**: accepts deliveries that carry no `webhook-signature` at all.
    ///
    /// Anyone who can reach the endpoint can then forge events, and replay protection is gone.
    /// Only for a sender whose tenant has signing deliberately off, on a network you trust.
    /// Signed deliveries are still verified, and refused if no configured secret matches.
    pub fn allow_unsigned(mut self) -> ReceiverBuilder {
        self.allow_unsigned = true;
        self
    }

    /// Checks the configuration and builds the receiver.
    pub fn build(self) -> Result<Receiver, ReceiveError> {
        if self.secrets.is_empty() && !self.allow_unsigned {
            return Err(ReceiveError::Config(
                "no signing secret; add one, or call allow_unsigned()",
            ));
        }
        // A delivery signed up to `tolerance` in the future verifies until twice the tolerance
        // after it arrived; a shorter memory would let a replay of it through as new.
        if self.horizon < self.tolerance.saturating_mul(2) {
            return Err(ReceiveError::Config(
                "the horizon must be at least twice the timestamp tolerance",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(ReceiveError::Config("the body size limit must be positive"));
        }
        if self.lease.is_zero() || self.recovery_interval.is_zero() {
            return Err(ReceiveError::Config(
                "the handler lease and recovery interval must be positive",
            ));
        }
        Ok(Receiver {
            inner: Arc::new(Inner {
                verifier: Verifier::new(self.secrets).with_tolerance(secs(self.tolerance)),
                store: self.store,
                allow_unsigned: self.allow_unsigned,
                horizon_ms: millis(self.horizon),
                lease_ms: millis(self.lease),
                recovery_interval: self.recovery_interval,
                prune_interval_ms: millis(self.prune_interval),
                last_prune_ms: AtomicI64::new(i64::MIN),
                max_body_bytes: self.max_body_bytes,
            }),
        })
    }
}

impl Receiver {
    /// Starts configuring a receiver that remembers deliveries in `store`.
    pub fn builder(store: impl DedupStore) -> ReceiverBuilder {
        ReceiverBuilder {
            store: Arc::new(store),
            secrets: Vec::new(),
            tolerance: Duration::from_secs(DEFAULT_TOLERANCE_SECS.unsigned_abs()),
            horizon: DEFAULT_HORIZON,
            lease: DEFAULT_HANDLER_LEASE,
            recovery_interval: DEFAULT_RECOVERY_INTERVAL,
            prune_interval: DEFAULT_PRUNE_INTERVAL,
            allow_unsigned: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// Authenticates, parses and records one delivery, at `now_unix_secs`.
    ///
    /// Answer 2xx to `Ok` of either kind; hand a [`Received::New`] event to
    /// [`process`](Receiver::process) after answering.
    #[tracing::instrument(skip_all, fields(webhook_id))]
    pub async fn receive(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix_secs: i64,
    ) -> Result<Received, ReceiveError> {
        if body.len() > self.inner.max_body_bytes {
            return Err(ReceiveError::TooLarge {
                limit: self.inner.max_body_bytes,
            });
        }
        let webhook_id = self.authenticate(headers, body, now_unix_secs)?;
        if let Some(id) = &webhook_id {
            tracing::Span::current().record("webhook_id", id.as_str());
        }
        let envelope: Envelope =
            serde_json::from_slice(body).map_err(|e| ReceiveError::not_an_envelope(&e))?;
        let now_ms = now_unix_secs.saturating_mul(1000);
        let record = Record {
            id: Uuid::now_v7(),
            webhook_id,
            tuple_digest: TupleDigest::of(&envelope),
            body: body.to_vec(),
            received_at_ms: now_ms,
            lease_until_ms: now_ms.saturating_add(self.inner.lease_ms),
        };
        let outcome = self
            .inner
            .store
            .record(&record, self.horizon_start(now_ms))
            .await?;
        self.prune_if_due(now_ms).await;
        match outcome {
            RecordOutcome::Recorded => Ok(Received::New(Event {
                envelope,
                body: record.body,
                webhook_id: record.webhook_id,
                record_id: record.id,
            })),
            RecordOutcome::Duplicate => {
                tracing::debug!("duplicate delivery discarded");
                Ok(Received::Duplicate)
            }
        }
    }

    /// Runs the handler on a new event and, when it returns `Ok`, marks the event processed.
    ///
    /// On `Err` the event stays pending, and a recovery pass after its lease hands it over again.
    #[tracing::instrument(skip_all, fields(webhook_id = ?event.webhook_id))]
    pub async fn process<H: Handler + ?Sized>(
        &self,
        event: Event,
        handler: &H,
    ) -> Result<(), ReceiveError> {
        let record_id = event.record_id;
        handler.handle(event).await.map_err(ReceiveError::Handler)?;
        self.inner
            .store
            .mark_processed(record_id, unix_now_ms())
            .await
    }

    /// Hands every recorded but unprocessed event whose lease has ended to `handler`, once.
    ///
    /// Run it at startup and then periodically (the axum integration does both): it finishes
    /// what a crash between the 2xx and the handler's `Ok` left undone.
    #[tracing::instrument(skip_all)]
    pub async fn recover<H: Handler + ?Sized>(
        &self,
        handler: &H,
        now_unix_secs: i64,
    ) -> Result<Recovered, ReceiveError> {
        let now_ms = now_unix_secs.saturating_mul(1000);
        let lease_until_ms = now_ms.saturating_add(self.inner.lease_ms);
        let mut recovered = Recovered::default();
        loop {
            // Leased records are skipped by later batches, so a failing event cannot loop here.
            let batch = self
                .inner
                .store
                .lease_pending(now_ms, lease_until_ms, RECOVERY_BATCH)
                .await?;
            let full = batch.len() == RECOVERY_BATCH as usize;
            for record in batch {
                let envelope: Envelope = match serde_json::from_slice(&record.body) {
                    Ok(envelope) => envelope,
                    Err(e) => {
                        // It parsed when it was recorded, so the store returned other bytes.
                        tracing::error!(record_id = %record.id, error = %ReceiveError::not_an_envelope(&e), "stored body is not an envelope");
                        recovered.failed += 1;
                        continue;
                    }
                };
                let event = Event {
                    envelope,
                    body: record.body,
                    webhook_id: record.webhook_id,
                    record_id: record.id,
                };
                match self.process(event, handler).await {
                    Ok(()) => recovered.handled += 1,
                    Err(e @ ReceiveError::Handler(_)) => {
                        tracing::warn!(record_id = %record.id, error = %e, "recovered event failed again");
                        recovered.failed += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            if !full {
                return Ok(recovered);
            }
        }
    }

    /// Deletes processed records older than the horizon; returns how many.
    pub async fn prune(&self, now_unix_secs: i64) -> Result<u64, ReceiveError> {
        let now_ms = now_unix_secs.saturating_mul(1000);
        self.inner.store.prune(self.horizon_start(now_ms)).await
    }

    /// How often a recovery pass should run.
    pub fn recovery_interval(&self) -> Duration {
        self.inner.recovery_interval
    }

    /// The largest body accepted, in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.inner.max_body_bytes
    }

    /// The `webhook-id` of a delivery that passed authentication.
    fn authenticate(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix_secs: i64,
    ) -> Result<Option<String>, ReceiveError> {
        // An empty header is what a sender with signing off puts there: no signature either.
        let unsigned = headers.get(HEADER_SIGNATURE).is_none_or(|v| v.is_empty());
        if self.inner.allow_unsigned && unsigned {
            let id = headers
                .get(HEADER_ID)
                .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            return Ok(id);
        }
        let parsed = Headers::from_http(headers).map_err(ReceiveError::Unauthenticated)?;
        self.inner
            .verifier
            .verify(&parsed, body, now_unix_secs)
            .map_err(ReceiveError::from_verify)?;
        Ok(Some(parsed.id.to_owned()))
    }

    fn horizon_start(&self, now_ms: i64) -> i64 {
        now_ms.saturating_sub(self.inner.horizon_ms)
    }

    /// Prunes at most once per interval; a failure must not fail the delivery that triggered it.
    async fn prune_if_due(&self, now_ms: i64) {
        let last = self.inner.last_prune_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < self.inner.prune_interval_ms {
            return;
        }
        // Only the caller that moves the mark prunes; the others carry on.
        if self
            .inner
            .last_prune_ms
            .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        match self.inner.store.prune(self.horizon_start(now_ms)).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(pruned = n, "pruned expired dedup records"),
            Err(e) => tracing::warn!(error = %e, "pruning expired dedup records failed"),
        }
    }
}

/// Now, in unix milliseconds.
pub(crate) fn unix_now_ms() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}
