//! The exactly-once ingest pipeline (SPEC §3), around one rule: a signal is decided once, and
//! that decision is what every retry, takeover and callback sees.
//!
//! Phases, after validation and authentication in the HTTP layer:
//! 1. **decide** ([`decide`]): one read (playbook version and the subject's facts before this
//!    signal), then the playbook, in process;
//! 2. **claim** (keyed signals, [`claim`]): the key row is inserted with the decision frozen on
//!    it;
//! 3. **act** ([`act`]): every effect, the callback's outbox row, the event and the response, in
//!    one transaction that also completes the key if our lock still holds. A fresh key's claim
//!    is in that same transaction, and its effects go ahead only if it won; a claim committed
//!    on its own (after a final failure, for an unmapped feed event, or when a test stops a
//!    signal there) is the recovery point `in_flight`. Claims and acts of the signals in flight
//!    share commits ([`group_commit`]);
//! 4. **send**: the inline callback attempt, from the outbox row just stored ([`inline`]).
//!
//! A request that fails while it holds a key releases the lock or stores a final error
//! ([`settle`]).

mod act;
mod approach;
mod call;
mod claim;
mod decide;
mod decision;
mod decision_reads;
mod group_commit;
mod ignored;
mod inline;
mod phases;
mod record;
mod settle;

use std::sync::{Arc, LazyLock};

use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::clock::{now_ms, to_ms};
use crate::delivery::Deliverer;
use crate::domain::Feed;
use crate::idempotency::{
    Cached, CompletedCache, DEFAULT_CAPACITY_BYTES, Fingerprint, IdempotencyKey, Payload,
};
use crate::playbook::{Library, Playbook};
use crate::secrets::Keyring;
use crate::signal::{Signal, Subject, subject_digest};
use crate::store::failpoint::failpoint;
use crate::store::{
    Claim, DecisionInputs, HeldKey, KeyRef, StoreError, StoredResponse, TenantRecord,
};

use claim::recorded_decision;
pub use decision::{Decided, DecisionRecord, Mapping};
use decision_reads::DecisionReads;
pub use decision_reads::READERS as DECISION_READERS;
use group_commit::GroupCommit;
pub use group_commit::MAX_BATCH;
pub use ignored::FeedEvent;
pub use record::SignalResponse;

/// Lifetimes that shape the key contract and the actions.
#[derive(Clone, Copy, Debug)]
pub struct IngestSettings {
    /// How long a key is remembered.
    pub key_ttl_ms: i64,
    /// How long a holder's lock protects it before another request may take over.
    pub lock_timeout_ms: i64,
    /// At most one customer alert per subject and signal type within this window.
    pub alert_window_ms: i64,
}

/// How the request ended, for the HTTP layer.
#[derive(Debug)]
pub enum Reply {
    /// Processed by this request.
    Fresh(StoredResponse),
    /// A completed key's stored response.
    Replayed(StoredResponse),
}

/// Why ingest did not produce a reply.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("a request with this idempotency key is being processed")]
    InProgress,
    #[error("this idempotency key was used with a different payload")]
    KeyReused,
    #[error("storage is unavailable; the request can be retried")]
    Unavailable(#[source] StoreError),
    #[error("storage failed")]
    Store(#[source] StoreError),
}

impl From<StoreError> for IngestError {
    fn from(err: StoreError) -> Self {
        if err.is_transient() {
            Self::Unavailable(err)
        } else {
            Self::Store(err)
        }
    }
}

/// A validated, authenticated signal ready for ingest.
pub struct Inbound<'a> {
    pub tenant: &'a TenantRecord,
    /// The feed it came in through; keys are scoped to it.
    pub feed: Feed,
    pub key: Option<IdempotencyKey>,
    pub signal: Signal,
    pub fingerprint: Fingerprint,
    /// SHA-256 of the raw body.
    pub raw_body: [u8; 32],
    /// The span of the HTTP request it came in, whose response's log line carries the
    /// decision (see [`record_decision`]).
    pub request_span: tracing::Span,
}

/// What a request derives once from its signal: every digest the phases need.
struct Prepared<'a> {
    inbound: &'a Inbound<'a>,
    /// The subject's keyed digest, scoped to the tenant.
    subject_hash: [u8; 32],
    /// Digest of (subject, type, observed_at): the same signal under any key or none.
    signal_key: [u8; 32],
    /// The idempotency key's row, if the request has a key.
    key: Option<KeyRef>,
    /// The request on its way to the group commit, until it queues its work there.
    approach: approach::Approach,
}

impl<'a> Prepared<'a> {
    /// The request as `decided` saw it, if a feed resolved its type or subject otherwise this
    /// time.
    fn as_decided(&self, decided: &Decided) -> Option<Inbound<'a>> {
        let signal = &self.inbound.signal;
        let signal_type = match decided.mapping {
            Some(Mapping::Type(recorded)) if recorded != signal.signal_type => Some(recorded),
            _ => None,
        };
        let subject = decided.subject.filter(|&s| s != self.subject_hash);
        if signal_type.is_none() && subject.is_none() {
            return None;
        }
        Some(Inbound {
            tenant: self.inbound.tenant,
            feed: self.inbound.feed,
            key: self.inbound.key.clone(),
            signal: Signal {
                signal_type: signal_type.unwrap_or(signal.signal_type),
                subject: subject.map_or_else(|| signal.subject.clone(), Subject::Digested),
                ..signal.clone()
            },
            fingerprint: self.inbound.fingerprint,
            raw_body: self.inbound.raw_body,
            request_span: self.inbound.request_span.clone(),
        })
    }
}

/// Where a signal's callbacks may go, as read with its decision: the tenant's endpoints.
#[derive(Clone, Debug)]
struct Destination {
    endpoints: Vec<crate::store::EndpointTarget>,
}

impl Destination {
    /// Takes the endpoints the read returned (no copy of them on a signal's path).
    fn of(inputs: DecisionInputs) -> Self {
        Self {
            endpoints: inputs.endpoints,
        }
    }
}

/// How an act stands to its idempotency key.
enum Keying {
    /// The signal has no key.
    None,
    /// The request holds the key (claimed before, or taken over).
    Held(HeldKey),
    /// A fresh key, claimed in the act's own commit.
    Claim(Claim),
}

/// How a fresh key's one commit, its claim with its act, came out.
enum OneCommit {
    /// Committed: the response, cached for replays.
    Done(StoredResponse),
    /// The key was there already; nothing of this request was stored.
    Taken,
    /// Failed for a reason that is not transient; nothing was stored.
    Failed,
}

/// A key this request holds, and the row's lifetime.
struct Holding {
    held: HeldKey,
    event_id: Uuid,
    decided: Decided,
    expires_at: i64,
}

/// How long shutdown waits for inline attempts still sending or recording: within the usual
/// 30 s between a termination signal and a kill.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(15);

pub use crate::store::ports::IngestStore;

/// The pipeline and what it needs.
pub struct Ingest {
    store: Arc<dyn IngestStore>,
    keys: Arc<Keyring>,
    settings: IngestSettings,
    playbooks: Library,
    deliverer: Arc<Deliverer>,
    completed: CompletedCache,
    commits: Arc<GroupCommit>,
    reads: DecisionReads,
    /// Inline attempts still sending or recording after their response went out; shutdown
    /// waits for them.
    background: TaskTracker,
}

impl Ingest {
    /// Builds the pipeline and starts its `committers` group committers, which gather for
    /// `gather` when idle (inside a Tokio runtime).
    pub fn new(
        store: Arc<dyn IngestStore>,
        committers: usize,
        gather: Option<std::time::Duration>,
        keys: Arc<Keyring>,
        settings: IngestSettings,
        deliverer: Arc<Deliverer>,
    ) -> Self {
        Self {
            commits: Arc::new(GroupCommit::start(
                store.clone(),
                committers,
                gather,
                settings.alert_window_ms,
            )),
            reads: DecisionReads::start(store.clone()),
            store,
            keys,
            settings,
            playbooks: Library::default(),
            deliverer,
            completed: CompletedCache::new(DEFAULT_CAPACITY_BYTES),
            background: TaskTracker::new(),
        }
    }

    /// Waits for the inline attempts still running (their sends and records) to end, for at
    /// most [`DRAIN_LIMIT`]; called once the server has stopped taking requests. An attempt
    /// cut off then is left to the worker once its delivery's lease ends, which sends the
    /// same bytes under the same `webhook-id`.
    pub async fn drain(&self) {
        self.background.close();
        if tokio::time::timeout(DRAIN_LIMIT, self.background.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = self.background.len(),
                "stopping with inline delivery attempts unrecorded; the worker retries them"
            );
        }
    }

    /// The lifetimes of keys and their locks in force.
    pub fn settings(&self) -> IngestSettings {
        self.settings
    }

    /// The tracker of work that outlives the request that started it (inline attempts and
    /// calls, an operator's connector call); [`Self::drain`] waits for it at shutdown.
    pub fn background(&self) -> &TaskTracker {
        &self.background
    }

    /// The subject's keyed digest, scoped to the tenant so digests do not correlate across
    /// tenants.
    pub fn subject_hash(&self, tenant_id: Uuid, signal: &Signal) -> [u8; 32] {
        subject_digest(&self.keys, tenant_id, &signal.subject)
    }

    /// The tenant's playbook in force now and its version (what a feed maps its event types
    /// with before the signal is decided).
    pub async fn playbook_in_force(
        &self,
        tenant_id: Uuid,
    ) -> Result<(Arc<Playbook>, i64), StoreError> {
        let inputs = self
            .reads
            .read(tenant_id, &[])
            .await?
            .ok_or_else(|| StoreError::Corrupt("the tenant is gone".into()))?;
        self.playbooks
            .get(&*self.store, tenant_id, inputs.playbook_version)
            .await
    }

    /// Runs a signal through decide, claim, act and send.
    #[tracing::instrument(skip_all, fields(tenant_id = %inbound.tenant.id, keyed = inbound.key.is_some()))]
    pub async fn run(&self, inbound: Inbound<'_>) -> Result<Reply, IngestError> {
        let signal = self.prepare(&inbound);
        match &signal.key {
            None => {
                // No key: at least once, and the idempotent actions absorb duplicates.
                let (decided, destination) = self.decide(&signal).await?;
                let response = self
                    .act(
                        &signal,
                        Uuid::now_v7(),
                        &decided,
                        &destination,
                        Keying::None,
                    )
                    .await?;
                Ok(Reply::Fresh(response))
            }
            Some(key) => self.run_keyed(&signal, key).await,
        }
    }

    /// A completed key's response for a request with exactly the bytes it cached, without
    /// parsing them: identical bytes are the same valid payload.
    pub fn replay_same_bytes(
        &self,
        tenant_id: Uuid,
        key: &IdempotencyKey,
        raw_body: &[u8; 32],
    ) -> Option<crate::idempotency::Replay> {
        // Registered once: a replay is the cheapest request there is, and looking the counter
        // up by name was a measurable part of it.
        static FROM_CACHE: LazyLock<metrics::Counter> =
            LazyLock::new(|| metrics::counter!("verdict_replays_from_cache_total"));
        let digest = self.key_digest(Feed::Signals, key);
        let replay = self
            .completed
            .get_by_raw_body(tenant_id, &digest, raw_body, now_ms());
        if replay.is_some() {
            FROM_CACHE.increment(1);
        }
        replay
    }

    /// The key's digest, scoped to its feed. A signal's key digests as it always has, so keys
    /// stored before the feeds existed still match.
    fn key_digest(&self, feed: Feed, key: &IdempotencyKey) -> Vec<u8> {
        match feed {
            Feed::Signals => self.keys.digest(&[b"idempotency-key", key.as_bytes()]),
            feed => self.keys.digest(&[
                b"idempotency-key",
                feed.endpoint().as_bytes(),
                key.as_bytes(),
            ]),
        }
        .to_vec()
    }

    fn prepare<'a>(&self, inbound: &'a Inbound<'a>) -> Prepared<'a> {
        let tenant_id = inbound.tenant.id;
        let signal = &inbound.signal;
        let subject_hash = self.subject_hash(tenant_id, signal);
        let signal_key = self.keys.digest(&[
            b"signal",
            &subject_hash,
            signal.signal_type.as_str().as_bytes(),
            &to_ms(signal.observed_at).to_be_bytes(),
        ]);
        let key = inbound.key.as_ref().map(|key| KeyRef {
            tenant_id,
            endpoint: inbound.feed.endpoint(),
            digest: self.key_digest(inbound.feed, key),
        });
        Prepared {
            inbound,
            subject_hash,
            signal_key,
            key,
            approach: self.commits.approach(),
        }
    }

    async fn run_keyed(&self, signal: &Prepared<'_>, key: &KeyRef) -> Result<Reply, IngestError> {
        let now = now_ms();
        let fingerprint = &signal.inbound.fingerprint.0;
        match self
            .completed
            .get(key.tenant_id, &key.digest, fingerprint, now)
        {
            Cached::Replay(response) => {
                metrics::counter!("verdict_replays_from_cache_total").increment(1);
                return Ok(Reply::Replayed(response));
            }
            Cached::Mismatch => return Err(IngestError::KeyReused),
            Cached::Miss => {}
        }
        let (decided, destination) = self.decide(signal).await?;
        let mut claim = self.new_claim(signal, key, &decided, now);
        let mut known_taken = false;
        match self
            .act_claiming(signal, key, &claim, &decided, &destination)
            .await?
        {
            OneCommit::Done(response) => return Ok(Reply::Fresh(response)),
            // Judged below as any claim that loses is.
            OneCommit::Taken => known_taken = true,
            // The claim commits on its own and the act runs once more under it, so that a
            // failure that persists is stored on the key and replayed; the claim's lock
            // starts now.
            OneCommit::Failed => claim = self.new_claim(signal, key, &decided, now_ms()),
        }
        let holding = match self.claim(signal, key, claim, decided, known_taken).await? {
            Ok(holding) => holding,
            Err(reply) => return Ok(reply),
        };
        failpoint!("ingest::after_claim");
        // A feed resolves a retry's type and subject again (its playbook's mapping, a
        // subscription); a key taken over is finished as its recorded decision saw them.
        if holding.decided.mapping == Some(Mapping::Unmapped) {
            let ignored = FeedEvent::retrying(signal.inbound, &holding.decided);
            return self.finish_ignored(ignored, key, holding).await;
        }
        match signal.as_decided(&holding.decided) {
            Some(inbound) => {
                let signal = self.prepare(&inbound);
                self.act_held(&signal, key, holding, &destination).await
            }
            None => self.act_held(signal, key, holding, &destination).await,
        }
    }

    /// Caches a completed key's response for replays, until the key row expires.
    fn remember(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        response: &StoredResponse,
        expires_at: i64,
    ) {
        self.completed.insert(
            (key.tenant_id, key.digest.clone()),
            payload(signal.inbound),
            response.clone(),
            expires_at,
        );
    }
}

/// What the completed-key cache compares a request's payload by.
fn payload(inbound: &Inbound<'_>) -> Payload {
    Payload {
        fingerprint: inbound.fingerprint.0.to_vec(),
        raw_body: inbound.raw_body,
    }
}

/// Logs a decision: on the HTTP request's span where the response's line shows it, rather than
/// on a line of its own (each line is formatted and written, a tenth of the server's CPU for
/// three: docs/benchmarks.md); else, and if the request is dropped before it answers, on its
/// own line.
fn record_decision(
    request_span: &tracing::Span,
    event_id: Uuid,
    decision: &'static str,
) -> DecisionLog {
    let on_response = request_span.has_field(crate::app::DECISION_FIELD)
        && !request_span.is_disabled()
        && tracing::enabled!(target: crate::app::RESPONSE_LOG_TARGET, tracing::Level::INFO);
    if !on_response {
        log_decision(event_id, decision);
        return DecisionLog { unanswered: None };
    }
    request_span.record(
        crate::app::EVENT_ID_FIELD,
        tracing::field::display(event_id),
    );
    request_span.record(crate::app::DECISION_FIELD, decision);
    DecisionLog {
        unanswered: Some((event_id, decision)),
    }
}

/// A decision recorded on its request's span, until the request answers: dropped before that
/// (the client went away, a deadline), the response's line never comes, so it logs the
/// decision on a line of its own.
#[must_use]
struct DecisionLog {
    unanswered: Option<(Uuid, &'static str)>,
}

impl DecisionLog {
    /// The request answers now; its response's line carries the decision.
    fn answered(mut self) {
        self.unanswered = None;
    }
}

impl Drop for DecisionLog {
    fn drop(&mut self) {
        if let Some((event_id, decision)) = self.unanswered.take() {
            log_decision(event_id, decision);
        }
    }
}

/// The decision on a line of its own.
fn log_decision(event_id: Uuid, decision: &str) {
    tracing::info!(%event_id, decision, "signal decided");
}
