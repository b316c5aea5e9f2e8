//! The exactly-once ingest pipeline (SPEC §3), around one rule: a signal is decided once, and
//! that decision is what every retry, takeover and callback sees.
//!
//! Phases, after validation and authentication in the HTTP layer:
//! 1. **decide**: one read (playbook version and the subject's facts before this signal), then
//!    the playbook, in process;
//! 2. **claim** (keyed signals): the key row is inserted with the decision frozen on it;
//! 3. **act**: every effect, the callback's outbox row, the event and the response, in one
//!    transaction that also completes the key if our lock still holds. A fresh key's claim
//!    is in that same transaction, and its effects go ahead only if it won; a claim committed
//!    on its own (after a final failure, for an unmapped feed event, or when a test stops a
//!    signal there) is the recovery point `in_flight`. Claims and acts of the signals in flight
//!    share commits ([`group_commit`]);
//! 4. **send**: the inline callback attempt, from the outbox row just stored ([`inline`]).
//!
//! A request that fails while it holds a key releases the lock or stores a final error
//! ([`settle`]).

mod decision;
mod decision_reads;
mod group_commit;
mod ignored;
mod inline;
mod record;
mod settle;

use std::sync::Arc;

use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::clock::{now_ms, to_ms};
use crate::delivery::Deliverer;
use crate::delivery::schedule;
use crate::domain::Feed;
use crate::failpoint::failpoint;
use crate::idempotency::{
    Cached, CompletedCache, DEFAULT_CAPACITY_BYTES, Fingerprint, IdempotencyKey, Payload,
};
use crate::playbook::{Library, Playbook, SubjectFacts};
use crate::secrets::Keyring;
use crate::signal::{Signal, Subject, subject_digest};
use crate::store::{
    Act, ActionTarget, CallbackDraft, Claim, ClaimOutcome, DecisionInputs, DueDelivery, HeldKey,
    KeyRef, KeyStore, PipelineStore, PlaybookStore, RecoveryPoint, StoreError, StoredResponse,
    TenantRecord,
};

pub use decision::{Decided, DecisionRecord, Mapping};
use decision_reads::DecisionReads;
pub use decision_reads::READERS as DECISION_READERS;
use group_commit::GroupCommit;
pub use group_commit::MAX_BATCH;
pub use ignored::FeedEvent;
use record::Draft;
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
        })
    }
}

/// Where a signal's callback goes, as read with its decision.
#[derive(Clone, Debug)]
struct Destination {
    url: Option<String>,
    disabled: bool,
}

impl Destination {
    fn of(inputs: &DecisionInputs) -> Self {
        Self {
            url: inputs.callback_url.clone(),
            disabled: inputs.callback_disabled,
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

/// What the pipeline reads and writes: idempotency keys, playbooks and what a decision reads,
/// and the group commit.
pub trait IngestStore: KeyStore + PlaybookStore + PipelineStore + Send + Sync {}

impl<T: ?Sized + KeyStore + PlaybookStore + PipelineStore + Send + Sync> IngestStore for T {}

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
    /// Builds the pipeline and starts its `committers` group committers (inside a Tokio
    /// runtime).
    pub fn new(
        store: Arc<dyn IngestStore>,
        committers: usize,
        keys: Arc<Keyring>,
        settings: IngestSettings,
        deliverer: Arc<Deliverer>,
    ) -> Self {
        Self {
            commits: Arc::new(GroupCommit::start(
                store.clone(),
                committers,
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
    ) -> Option<StoredResponse> {
        let digest = self.key_digest(Feed::Signals, key);
        let replay = self
            .completed
            .get_by_raw_body(tenant_id, &digest, raw_body, now_ms());
        if replay.is_some() {
            metrics::counter!("verdict_replays_from_cache_total").increment(1);
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

    /// A fresh key's claim committed with its act: one commit, and nothing of the signal is
    /// stored unless all of it is. A transient failure is the request's (nothing was stored:
    /// the retry decides afresh, as a first request would).
    async fn act_claiming(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        claim: &Claim,
        decided: &Decided,
        destination: &Destination,
    ) -> Result<OneCommit, IngestError> {
        let keying = Keying::Claim(claim.clone());
        match self
            .act(signal, claim.event_id, decided, destination, keying)
            .await
        {
            Ok(response) => {
                self.remember(signal, key, &response, claim.expires_at);
                Ok(OneCommit::Done(response))
            }
            Err(IngestError::Unavailable(StoreError::LockLost)) => Ok(OneCommit::Taken),
            Err(err @ IngestError::Unavailable(_)) => Err(err),
            Err(err) => {
                tracing::warn!(error = ?err, "a fresh key's commit failed; claiming it on its own");
                Ok(OneCommit::Failed)
            }
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

    /// Finishes a feed event whose key recorded it as a signal, taken over after its playbook
    /// stopped mapping its event type: as that signal, with the recorded decision.
    async fn finish_as_signal(
        &self,
        inbound: &Inbound<'_>,
        key: &KeyRef,
        holding: Holding,
    ) -> Result<Reply, IngestError> {
        let signal = self.prepare(inbound);
        let destination = match self.destination(&signal).await {
            Ok(destination) => destination,
            Err(err) => {
                let err = IngestError::from(err);
                self.settle_failure(&err, &holding.held).await;
                return Err(err);
            }
        };
        self.act_held(&signal, key, holding, &destination).await
    }

    /// Where the signal's callback goes, read now.
    async fn destination(&self, signal: &Prepared<'_>) -> Result<Destination, StoreError> {
        Ok(Destination::of(&self.inputs(signal).await?))
    }

    /// What a decision reads about the signal's tenant and subject, in one batched read.
    async fn inputs(&self, signal: &Prepared<'_>) -> Result<DecisionInputs, StoreError> {
        self.reads
            .read(signal.inbound.tenant.id, &signal.subject_hash)
            .await?
            // The tenant authenticated a moment ago; gone now means it was deleted under us.
            .ok_or_else(|| StoreError::Corrupt("the tenant is gone".into()))
    }

    /// Acts on a signal whose key this request holds, caching the response it completes with
    /// or settling the key after a failure.
    async fn act_held(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        holding: Holding,
        destination: &Destination,
    ) -> Result<Reply, IngestError> {
        let result = self
            .act(
                signal,
                holding.event_id,
                &holding.decided,
                destination,
                Keying::Held(holding.held.clone()),
            )
            .await;
        match &result {
            Ok(response) => self.remember(signal, key, response, holding.expires_at),
            Err(err) => self.settle_failure(err, &holding.held).await,
        }
        result.map(Reply::Fresh)
    }

    /// Decides the signal from the playbook in force and the subject's facts before it.
    async fn decide(&self, signal: &Prepared<'_>) -> Result<(Decided, Destination), StoreError> {
        let tenant_id = signal.inbound.tenant.id;
        let inputs = self.inputs(signal).await?;
        let (playbook, playbook_version) = self
            .playbooks
            .get(&*self.store, tenant_id, inputs.playbook_version)
            .await?;
        let facts = SubjectFacts {
            locked: inputs.subject_locked,
        };
        let now = time::OffsetDateTime::now_utc();
        let ruling = playbook.decide(&signal.inbound.signal, facts, now);
        let decided = Decided {
            decision: ruling.decision,
            rule: ruling.rule,
            actions: ruling.actions,
            playbook_version,
            evaluated_at: to_ms(now),
            facts,
            mapping: Some(Mapping::Type(signal.inbound.signal.signal_type)),
            subject: Some(signal.subject_hash),
        };
        Ok((decided, Destination::of(&inputs)))
    }

    /// A claim of the key for this request, with the decision frozen on it.
    fn new_claim(&self, signal: &Prepared<'_>, key: &KeyRef, decided: &Decided, now: i64) -> Claim {
        Claim {
            key: key.clone(),
            fingerprint: signal.inbound.fingerprint.0.to_vec(),
            event_id: Uuid::now_v7(),
            lock_token: Uuid::new_v4(),
            now,
            locked_until: now.saturating_add(self.settings.lock_timeout_ms),
            expires_at: now.saturating_add(self.settings.key_ttl_ms),
            ruling: record::json(decided),
        }
    }

    /// Commits the claim on its own, or learns what holds the key (at once when the key is
    /// `known_taken`). `Err(reply)` when the key's stored response answers the request.
    async fn claim(
        &self,
        signal: &Prepared<'_>,
        key: &KeyRef,
        claim: Claim,
        decided: Decided,
        known_taken: bool,
    ) -> Result<Result<Holding, Reply>, IngestError> {
        let holding = |event_id, decided, expires_at| Holding {
            held: HeldKey {
                key: key.clone(),
                lock_token: claim.lock_token,
            },
            event_id,
            decided,
            expires_at,
        };
        if !known_taken && self.commits.claim(claim.clone()).await? {
            return Ok(Ok(holding(claim.event_id, decided, claim.expires_at)));
        }
        Ok(match self.store.claim(&claim).await? {
            ClaimOutcome::Started => Ok(holding(claim.event_id, decided, claim.expires_at)),
            ClaimOutcome::TakenOver {
                event_id,
                from,
                expires_at,
            } => {
                tracing::info!(%event_id, "took over an abandoned idempotency key");
                let taken = holding(event_id, decided, expires_at);
                match recorded_decision(from) {
                    Ok(recorded) => Ok(Holding {
                        decided: recorded.unwrap_or(taken.decided),
                        ..taken
                    }),
                    Err(err) => {
                        // The key is ours now: a final error is stored, not left locked.
                        let err = IngestError::from(err);
                        self.settle_failure(&err, &taken.held).await;
                        return Err(err);
                    }
                }
            }
            ClaimOutcome::InProgress => return Err(IngestError::InProgress),
            ClaimOutcome::Mismatch => return Err(IngestError::KeyReused),
            ClaimOutcome::Completed {
                response,
                expires_at,
            } => {
                self.remember(signal, key, &response, expires_at);
                Err(Reply::Replayed(response))
            }
        })
    }

    /// Writes the decided signal's effects, outbox row, event and response in one commit,
    /// then makes the callback's inline attempt from the stored row.
    async fn act(
        &self,
        signal: &Prepared<'_>,
        event_id: Uuid,
        decided: &Decided,
        destination: &Destination,
        keying: Keying,
    ) -> Result<StoredResponse, IngestError> {
        let tenant = signal.inbound.tenant;
        let target = ActionTarget {
            tenant_id: tenant.id,
            event_id,
            subject_hash: signal.subject_hash.to_vec(),
            signal_key: signal.signal_key.to_vec(),
            signal_type: signal.inbound.signal.signal_type.as_str(),
            now: now_ms(),
        };
        let draft = Arc::new(Draft::new(
            signal.inbound,
            &target,
            decided.clone(),
            callback_refusal(destination, decided),
        ));
        let wants_callback = decided.wants_callback() && draft.callback_refusal.is_none();
        let callback = wants_callback.then(|| CallbackDraft {
            id: Uuid::now_v7(),
            webhook_id: format!("msg_{}", event_id.simple()),
            leased_until: target.now.saturating_add(crate::delivery::lease_ms()),
        });
        let act = Act::new(None, target, decided.effects(), callback, draft);
        let act = match keying {
            Keying::None => act,
            Keying::Held(held) => Act {
                held: Some(held),
                ..act
            },
            Keying::Claim(claim) => act.claiming(claim),
        };
        let committed = self.commits.act(act).await?;
        failpoint!("ingest::after_dispatch");
        metrics::counter!("verdict_decisions_total", "decision" => decided.decision.as_str())
            .increment(1);
        tracing::info!(%event_id, decision = decided.decision.as_str(), "signal decided");
        // Only the event whose commit inserted the outbox row makes the inline attempt; a
        // duplicate's callback is the earlier event's.
        if let Some(delivery) = committed.delivery {
            let leased_until = delivery.leased_until;
            self.attempt_inline(
                DueDelivery {
                    id: delivery.id,
                    tenant_id: tenant.id,
                    webhook_id: delivery.webhook_id,
                    payload: delivery.payload,
                    retries_left: schedule::MAX_RETRIES,
                    callback_url: destination.url.clone(),
                },
                leased_until,
            )
            .await;
        }
        Ok(committed.response)
    }
}

/// What the completed-key cache compares a request's payload by.
fn payload(inbound: &Inbound<'_>) -> Payload {
    Payload {
        fingerprint: inbound.fingerprint.0.to_vec(),
        raw_body: inbound.raw_body,
    }
}

/// Why a decision's callback cannot be recorded, if it cannot.
fn callback_refusal(destination: &Destination, decided: &Decided) -> Option<&'static str> {
    match (&destination.url, destination.disabled) {
        _ if !decided.wants_callback() => None,
        (None, _) => Some("no callback URL is configured"),
        (Some(_), true) => Some("the callback endpoint is disabled"),
        (Some(_), false) => None,
    }
}

/// The decision a taken-over row recorded; `None` for a v1 row claimed before decisions were
/// recorded (nothing of it was applied by this version, so deciding now is deciding once).
fn recorded_decision(from: RecoveryPoint) -> Result<Option<Decided>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(e.to_string());
    Ok(match from {
        RecoveryPoint::InFlight { ruling: None } => None,
        RecoveryPoint::InFlight {
            ruling: Some(ruling),
        } => {
            let mut recorded: Decided = serde_json::from_str(&ruling).map_err(corrupt)?;
            // Recorded before the mapping was kept: an ignored feed event says so by its rule.
            if recorded.mapping.is_none() && recorded.rule == ignored::IGNORED_RULE {
                recorded.mapping = Some(Mapping::Unmapped);
            }
            Some(recorded)
        }
        RecoveryPoint::Dispatched { action_results } => Some(Decided::from_v1_record(
            serde_json::from_str(&action_results).map_err(corrupt)?,
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::playbook::Decision;

    fn in_flight(ruling: serde_json::Value) -> RecoveryPoint {
        RecoveryPoint::InFlight {
            ruling: Some(ruling.to_string()),
        }
    }

    #[test]
    fn a_recorded_decision_keeps_its_mapping_and_subject() {
        let decided = Decided {
            decision: Decision::Deny,
            rule: "recent_sim_swap".into(),
            actions: vec![],
            playbook_version: 3,
            evaluated_at: 1,
            facts: SubjectFacts::default(),
            mapping: Some(Mapping::Type(crate::signal::SignalType::PortOut)),
            subject: Some([7; 32]),
        };
        let ruling = serde_json::to_value(&decided).unwrap();
        assert_eq!(recorded_decision(in_flight(ruling)).unwrap(), Some(decided));
    }

    #[test]
    fn an_ignored_event_recorded_before_mappings_were_kept_is_still_unmapped() {
        let ruling = serde_json::json!({
            "decision": "allow", "rule": "unmapped_event_type", "actions": [],
            "playbook_version": 2, "evaluated_at": 1, "facts": { "locked": false },
        });
        let recorded = recorded_decision(in_flight(ruling)).unwrap().unwrap();
        assert_eq!(recorded.mapping, Some(Mapping::Unmapped));
        assert_eq!(recorded.subject, None);
    }

    #[test]
    fn a_signal_recorded_before_mappings_were_kept_has_none() {
        let ruling = serde_json::json!({
            "decision": "deny", "rule": "recent_sim_swap", "actions": ["lock_account"],
            "playbook_version": 2, "evaluated_at": 1, "facts": { "locked": false },
        });
        let recorded = recorded_decision(in_flight(ruling)).unwrap().unwrap();
        assert_eq!(recorded.mapping, None);
    }

    #[test]
    fn a_recorded_subject_that_is_not_a_digest_is_corrupt() {
        let ruling = serde_json::json!({
            "decision": "deny", "rule": "r", "actions": [], "playbook_version": 2,
            "evaluated_at": 1, "facts": { "locked": false }, "subject": "c2hvcnQ=",
        });
        assert!(matches!(
            recorded_decision(in_flight(ruling)),
            Err(StoreError::Corrupt(_))
        ));
    }
}
