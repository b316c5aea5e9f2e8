//! The exactly-once ingest pipeline, phase by phase (SPEC §3): claim the key, act, record the
//! recovery point, persist. Validation and authentication happen before, in the HTTP layer.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::actions::{ActionKind, ActionResult, Applied, Outcome};
use crate::clock::{now_ms, to_ms};
use crate::delivery::Deliverer;
use crate::delivery::schedule::{self, Trigger};
use crate::failpoint::failpoint;
use crate::idempotency::{
    Cached, CompletedCache, DEFAULT_CAPACITY, Fingerprint, IdempotencyKey, SIGNALS_ENDPOINT,
};
use crate::playbook::{Decision, Library, SubjectFacts};
use crate::secrets::{Keyring, hex};
use crate::signal::Signal;
use crate::store::{
    ActionTarget, Claim, ClaimOutcome, Completion, Dispatch, DueDelivery, KeyRef, NewDelivery,
    NewEvent, Recorded, RecoveryPoint, Store, StoreError, StoredResponse, TenantRecord,
};

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

/// The decision and action outcomes: what the recovery point stores and the response reports.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DecisionRecord {
    pub decision: Decision,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: Vec<ActionResult>,
}

/// The success body of `POST /v1/signals`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SignalResponse {
    pub event_id: Uuid,
    pub subject_hash: String,
    #[serde(flatten)]
    pub record: DecisionRecord,
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

/// A validated, authenticated signal ready for ingest.
pub struct Inbound<'a> {
    pub tenant: &'a TenantRecord,
    pub key: Option<IdempotencyKey>,
    pub signal: Signal,
    pub fingerprint: Fingerprint,
}

/// The pipeline and what it needs.
pub struct Ingest {
    store: Arc<dyn Store>,
    keys: Arc<Keyring>,
    settings: IngestSettings,
    playbooks: Library,
    deliverer: Arc<Deliverer>,
    completed: CompletedCache,
}

/// A held claim: the row's key and our lock on it.
struct Held {
    key: KeyRef,
    lock_token: Uuid,
}

impl Ingest {
    /// Builds the pipeline.
    pub fn new(
        store: Arc<dyn Store>,
        keys: Arc<Keyring>,
        settings: IngestSettings,
        deliverer: Arc<Deliverer>,
    ) -> Self {
        Self {
            store,
            keys,
            settings,
            playbooks: Library::default(),
            deliverer,
            completed: CompletedCache::new(DEFAULT_CAPACITY),
        }
    }

    /// The subject's keyed digest, scoped to the tenant so digests do not correlate across
    /// tenants.
    pub fn subject_hash(&self, tenant_id: Uuid, signal: &Signal) -> [u8; 32] {
        self.keys.digest(&[
            b"subject",
            tenant_id.as_bytes(),
            signal.subject.kind().as_bytes(),
            signal.subject.value().as_bytes(),
        ])
    }

    /// Runs a signal through claim, act, dispatch and persist.
    #[tracing::instrument(skip_all, fields(tenant_id = %inbound.tenant.id, keyed = inbound.key.is_some()))]
    pub async fn run(&self, inbound: Inbound<'_>) -> Result<Reply, IngestError> {
        let Some(key) = &inbound.key else {
            // No key: at least once, and the idempotent actions absorb duplicates.
            // The event is stored with the recovery point, so there is nothing to persist after.
            let event_id = Uuid::now_v7();
            let record = self.act(&inbound, event_id, None).await?;
            return Ok(Reply::Fresh(self.decided(&inbound, event_id, record)));
        };
        let now = now_ms();
        let claim = Claim {
            key: KeyRef {
                tenant_id: inbound.tenant.id,
                endpoint: SIGNALS_ENDPOINT,
                digest: self
                    .keys
                    .digest(&[b"idempotency-key", key.as_bytes()])
                    .to_vec(),
            },
            fingerprint: inbound.fingerprint.0.to_vec(),
            event_id: Uuid::now_v7(),
            lock_token: Uuid::new_v4(),
            now,
            locked_until: now.saturating_add(self.settings.lock_timeout_ms),
            expires_at: now.saturating_add(self.settings.key_ttl_ms),
        };
        let tenant_id = inbound.tenant.id;
        match self
            .completed
            .get(tenant_id, &claim.key.digest, &claim.fingerprint, now)
        {
            Cached::Replay(response) => {
                metrics::counter!("verdict_replays_from_cache_total").increment(1);
                return Ok(Reply::Replayed(response));
            }
            Cached::Mismatch => return Err(IngestError::KeyReused),
            Cached::Miss => {}
        }
        let (event_id, from) = match self.store.claim(&claim).await.map_err(classify)? {
            ClaimOutcome::Started => (claim.event_id, RecoveryPoint::InFlight),
            ClaimOutcome::TakenOver { event_id, from } => {
                tracing::info!(%event_id, "took over an abandoned idempotency key");
                (event_id, from)
            }
            ClaimOutcome::InProgress => return Err(IngestError::InProgress),
            ClaimOutcome::Mismatch => return Err(IngestError::KeyReused),
            ClaimOutcome::Completed {
                response,
                expires_at,
            } => {
                let (digest, fingerprint) = (claim.key.digest, claim.fingerprint);
                self.completed
                    .insert(tenant_id, digest, fingerprint, response.clone(), expires_at);
                return Ok(Reply::Replayed(response));
            }
        };
        let held = Held {
            key: claim.key,
            lock_token: claim.lock_token,
        };
        let result = self.resume(&inbound, event_id, from, &held).await;
        match &result {
            Ok(response) => self.completed.insert(
                tenant_id,
                held.key.digest.clone(),
                claim.fingerprint,
                response.clone(),
                claim.expires_at,
            ),
            Err(err) => self.settle_failure(err, &held).await,
        }
        result.map(Reply::Fresh)
    }

    /// Continues a held claim from its recovery point.
    async fn resume(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        from: RecoveryPoint,
        held: &Held,
    ) -> Result<StoredResponse, IngestError> {
        failpoint!("ingest::after_claim");
        let record = match from {
            RecoveryPoint::InFlight => self.act(inbound, event_id, Some(held)).await?,
            RecoveryPoint::Dispatched { action_results } => {
                tracing::info!(%event_id, "resuming from the dispatched recovery point");
                serde_json::from_str(&action_results)
                    .map_err(|e| IngestError::Store(StoreError::Corrupt(e.to_string())))?
            }
        };
        self.persist(inbound, event_id, record, held)
            .await
            .map_err(classify)
    }

    /// Decides, runs each action, and records the recovery point: the callback's outbox row
    /// and (for a keyed request) the decision record on the key, in one transaction.
    async fn act(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        held: Option<&Held>,
    ) -> Result<DecisionRecord, IngestError> {
        let tenant = inbound.tenant;
        let signal = &inbound.signal;
        let (playbook, playbook_version) = self.playbooks.current(&*self.store, tenant.id).await?;
        let subject_hash = self.subject_hash(tenant.id, signal).to_vec();
        let facts = if playbook.needs_subject_facts() {
            SubjectFacts {
                locked: self.store.subject_locked(tenant.id, &subject_hash).await?,
            }
        } else {
            SubjectFacts::default()
        };
        let now = OffsetDateTime::now_utc();
        let verdict = playbook.decide(signal, facts, now);
        let target = ActionTarget {
            tenant_id: tenant.id,
            event_id,
            signal_key: self
                .keys
                .digest(&[
                    b"signal",
                    &subject_hash,
                    signal.signal_type.as_str().as_bytes(),
                    &to_ms(signal.observed_at).to_be_bytes(),
                ])
                .to_vec(),
            subject_hash,
            signal_type: signal.signal_type.as_str(),
            now: to_ms(now),
        };

        let mut done = Vec::with_capacity(verdict.actions.len());
        for &action in &verdict.actions {
            let applied = match action {
                ActionKind::Callback => continue, // recorded with the recovery point below
                ActionKind::LockAccount => self.store.lock_account(&target).await?,
                ActionKind::OpenCase => self.store.open_case(&target).await?,
                ActionKind::AlertCustomer => {
                    self.store
                        .alert_customer(&target, self.settings.alert_window_ms)
                        .await?
                }
                ActionKind::ChargeStepUp => self.store.charge_step_up(&target).await?,
                ActionKind::Deny => self.store.deny_subject(&target).await?,
            };
            done.push(ActionResult {
                action,
                outcome: applied.into(),
            });
            failpoint!(after_action(action));
        }

        let wants_callback = verdict.actions.contains(&ActionKind::Callback);
        let callback = match (&tenant.callback_url, tenant.callback_disabled) {
            _ if !wants_callback => Ok(None),
            (None, _) => Err("no callback URL is configured"),
            (Some(_), true) => Err("the callback endpoint is disabled"),
            (Some(_), false) => Ok(Some(self.envelope(
                inbound,
                &target,
                verdict.decision,
                &done,
            ))),
        };
        let record_for = |callback_outcome: Option<Applied>| {
            let actions = verdict
                .actions
                .iter()
                .filter_map(|&action| match action {
                    ActionKind::Callback => Some(ActionResult {
                        action,
                        outcome: match (&callback, callback_outcome) {
                            (Err(why), _) => Outcome::Failed((*why).to_owned()),
                            (Ok(_), Some(applied)) => applied.into(),
                            (Ok(_), None) => Outcome::Failed("not recorded".into()),
                        },
                    }),
                    _ => done.iter().find(|r| r.action == action).cloned(),
                })
                .collect();
            DecisionRecord {
                decision: verdict.decision,
                playbook_version,
                rule: verdict.rule.clone(),
                actions,
            }
        };
        let to_store = |outcome: Option<Applied>| {
            let record = record_for(outcome);
            Recorded {
                record: json(&record),
                event: held
                    .is_none()
                    .then(|| self.new_event(inbound, event_id, &record)),
            }
        };
        let delivery = callback.as_ref().ok().and_then(Option::as_ref);
        let callback_outcome = self
            .store
            .dispatch(&Dispatch {
                target: &target,
                key: held.map(|h| (&h.key, h.lock_token)),
                callback: delivery,
                record: &to_store,
            })
            .await?;
        failpoint!("ingest::after_dispatch");
        // Only the event that recorded the delivery makes the inline attempt; a duplicate's
        // callback is the earlier event's.
        if let (Some(delivery), Some(Applied::Done)) = (delivery, callback_outcome) {
            self.attempt_inline(DueDelivery {
                id: delivery.id,
                tenant_id: tenant.id,
                webhook_id: delivery.webhook_id.clone(),
                payload: delivery.payload.clone(),
                retries_left: schedule::MAX_RETRIES,
                callback_url: tenant.callback_url.clone(),
            })
            .await;
        }
        Ok(record_for(callback_outcome))
    }

    /// The callback's inline attempt. It waits at most the deadline: an attempt still running
    /// then finishes (and records itself) in the background while the response goes out.
    async fn attempt_inline(&self, due: DueDelivery) {
        let deliverer = self.deliverer.clone();
        let deadline = deliverer.settings().deadline;
        let attempt = tokio::spawn(async move { deliverer.attempt(&due, Trigger::Inline).await });
        match tokio::time::timeout(deadline, attempt).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(err))) => {
                // The delivery stays leased, then due: the worker retries it.
                tracing::warn!(error = %err, "could not record the inline delivery attempt");
            }
            Ok(Err(err)) => tracing::error!(error = %err, "the inline delivery attempt panicked"),
            Err(_) => tracing::info!(
                "inline delivery attempt passed its deadline; continuing in the background"
            ),
        }
    }

    /// The callback envelope, built once: its timestamp is fixed here and repeated on every
    /// retry and redelivery.
    fn envelope(
        &self,
        inbound: &Inbound<'_>,
        target: &ActionTarget,
        decision: Decision,
        actions: &[ActionResult],
    ) -> NewDelivery {
        let envelope = verdict_webhooks::Envelope {
            event_id: target.event_id.to_string(),
            tenant: inbound.tenant.id.to_string(),
            event_type: format!("decision.{}", target.signal_type),
            subject_hash: hex(&target.subject_hash),
            timestamp: OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            decision: decision.as_str().to_owned(),
            actions: serde_json::to_value(actions).unwrap_or_default(),
            metadata: serde_json::Value::Object(inbound.signal.metadata.clone()),
        };
        NewDelivery {
            id: Uuid::now_v7(),
            webhook_id: format!("msg_{}", target.event_id.simple()),
            payload: json(&envelope).into_bytes(),
            leased_until: target.now.saturating_add(crate::delivery::lease_ms()),
        }
    }

    /// The event row for a decision.
    fn new_event(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        record: &DecisionRecord,
    ) -> NewEvent {
        let signal = &inbound.signal;
        NewEvent {
            id: event_id,
            tenant_id: inbound.tenant.id,
            signal_type: signal.signal_type.as_str(),
            subject_hash: self.subject_hash(inbound.tenant.id, signal).to_vec(),
            observed_at: to_ms(signal.observed_at),
            attributes: json(&signal.attributes),
            metadata: json(&signal.metadata),
            decision: record.decision.as_str(),
            playbook_version: record.playbook_version,
            rule: record.rule.clone(),
            actions: json(&record.actions),
            created_at: now_ms(),
        }
    }

    /// The response to a decision that is stored; counts and logs it.
    fn decided(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        record: DecisionRecord,
    ) -> StoredResponse {
        let decision = record.decision;
        let response = self.respond(inbound, event_id, record);
        metrics::counter!("verdict_decisions_total", "decision" => decision.as_str()).increment(1);
        tracing::info!(%event_id, decision = decision.as_str(), "signal decided");
        response
    }

    /// The response body for a decision.
    fn respond(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        record: DecisionRecord,
    ) -> StoredResponse {
        let body = SignalResponse {
            event_id,
            subject_hash: hex(&self.subject_hash(inbound.tenant.id, &inbound.signal)),
            record,
        };
        StoredResponse {
            status: 200,
            body: json(&body).into_bytes(),
        }
    }

    /// Stores the event and the response and completes the key, in one transaction.
    async fn persist(
        &self,
        inbound: &Inbound<'_>,
        event_id: Uuid,
        record: DecisionRecord,
        held: &Held,
    ) -> Result<StoredResponse, StoreError> {
        let event = self.new_event(inbound, event_id, &record);
        let decision = record.decision;
        let response = self.respond(inbound, event_id, record);
        failpoint!("ingest::before_persist");
        self.store
            .complete(&Completion {
                event: Some(event),
                key: Some((held.key.clone(), held.lock_token)),
                response: response.clone(),
            })
            .await?;
        metrics::counter!("verdict_decisions_total", "decision" => decision.as_str()).increment(1);
        tracing::info!(%event_id, decision = decision.as_str(), "signal decided");
        Ok(response)
    }

    /// After a failure with the key held: a transient one releases the lock so the retry
    /// resumes from the recovery point; a final one is stored and replayed.
    async fn settle_failure(&self, err: &IngestError, held: &Held) {
        match err {
            IngestError::Unavailable(_) | IngestError::InProgress | IngestError::KeyReused => {
                if let Err(release) = self.store.release(&held.key, held.lock_token).await {
                    tracing::warn!(error = %release, "could not release an idempotency lock");
                }
            }
            IngestError::Store(cause) => {
                tracing::error!(error = ?cause, "signal failed permanently; storing the 500");
                let response = StoredResponse {
                    status: 500,
                    body: crate::http::problem::Problem::internal().to_json(),
                };
                let completion = Completion {
                    event: None,
                    key: Some((held.key.clone(), held.lock_token)),
                    response,
                };
                if let Err(store) = self.store.complete(&completion).await {
                    tracing::warn!(error = %store, "could not store a final error");
                }
            }
        }
    }
}

impl From<StoreError> for IngestError {
    fn from(err: StoreError) -> Self {
        classify(err)
    }
}

fn classify(err: StoreError) -> IngestError {
    if err.is_transient() {
        IngestError::Unavailable(err)
    } else {
        IngestError::Store(err)
    }
}

/// The failpoint after an action, named `act::after_<action>`.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
fn after_action(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LockAccount => "act::after_lock_account",
        ActionKind::OpenCase => "act::after_open_case",
        ActionKind::AlertCustomer => "act::after_alert_customer",
        ActionKind::ChargeStepUp => "act::after_charge_step_up",
        ActionKind::Deny => "act::after_deny",
        ActionKind::Callback => "act::after_callback",
    }
}

/// Serialises our own types and JSON maps, which cannot fail: no non-string map keys and no
/// failing `Serialize` impls.
fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("serialising owned JSON-safe values cannot fail")
}
