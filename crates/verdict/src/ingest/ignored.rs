//! Feed events no signal type maps to: recorded exactly once under their natural key, through
//! the same claim and commit as a signal, as an event that decided nothing (decision
//! `ignored`, no actions, no callback). They stay visible in the events API.

use std::sync::Arc;

use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{
    Decided, Holding, Inbound, Ingest, IngestError, Mapping, Reply, approach::Approach, record,
    recorded_decision,
};
use crate::clock::{now_ms, to_ms};
use crate::domain::{ActionKind, Applied};
use crate::domain::{Feed, UNMAPPED_TYPE};
use crate::idempotency::{Cached, Fingerprint, IdempotencyKey, Payload};
use crate::playbook::{Decision, SubjectFacts};
use crate::signal::{Signal, SignalType, Subject, subject_digest};
use crate::store::failpoint::failpoint;
use crate::store::{
    Act, ActOutcome, ActionTarget, Claim, ClaimOutcome, Finished, HeldKey, KeyRef, NewEvent,
    Render, StoredResponse, TenantRecord,
};

/// The rule it records.
pub(super) const IGNORED_RULE: &str = "unmapped_event_type";

/// An authenticated feed event, before its event type is mapped to a signal type (or to none).
pub struct FeedEvent<'a> {
    pub tenant: &'a TenantRecord,
    pub feed: Feed,
    pub subject: Subject,
    pub observed_at: OffsetDateTime,
    /// Facts about it that name no identifier (its event type).
    pub attributes: Map<String, Value>,
    pub metadata: Map<String, Value>,
    pub fingerprint: Fingerprint,
    /// SHA-256 of the raw body.
    pub raw_body: [u8; 32],
    /// The playbook version whose mapping it was mapped under.
    pub playbook_version: i64,
}

impl<'a> FeedEvent<'a> {
    /// A keyed request being retried whose key recorded it as unmapped.
    pub(super) fn retrying(inbound: &Inbound<'a>, decided: &Decided) -> Self {
        let signal = &inbound.signal;
        Self {
            tenant: inbound.tenant,
            feed: inbound.feed,
            subject: decided
                .subject
                .map_or_else(|| signal.subject.clone(), Subject::Digested),
            observed_at: signal.observed_at,
            attributes: signal.attributes.clone(),
            metadata: signal.metadata.clone(),
            fingerprint: inbound.fingerprint,
            raw_body: inbound.raw_body,
            playbook_version: decided.playbook_version,
        }
    }

    /// The event as a signal of type `signal_type`, under its natural key.
    pub fn into_signal(self, key: IdempotencyKey, signal_type: SignalType) -> Inbound<'a> {
        Inbound {
            tenant: self.tenant,
            feed: self.feed,
            key: Some(key),
            signal: Signal {
                signal_type,
                subject: self.subject,
                observed_at: self.observed_at,
                attributes: self.attributes,
                metadata: self.metadata,
            },
            fingerprint: self.fingerprint,
            raw_body: self.raw_body,
            request_span: tracing::Span::current(),
        }
    }
}

impl Ingest {
    /// Records an unmapped feed event once under its natural key `key`: a duplicate replays, a
    /// key reused with another payload is refused, and nothing is decided or done.
    #[tracing::instrument(skip_all, fields(tenant_id = %ignored.tenant.id, feed = ignored.feed.as_str()))]
    pub async fn record_ignored(
        &self,
        ignored: FeedEvent<'_>,
        key: IdempotencyKey,
    ) -> Result<Reply, IngestError> {
        let tenant_id = ignored.tenant.id;
        let key_ref = KeyRef {
            tenant_id,
            endpoint: ignored.feed.endpoint(),
            digest: self.key_digest(ignored.feed, &key),
        };
        let now = now_ms();
        let fingerprint = ignored.fingerprint.0.to_vec();
        match self
            .completed
            .get(tenant_id, &key_ref.digest, &fingerprint, now)
        {
            Cached::Replay(response) => return Ok(Reply::Replayed(response)),
            Cached::Mismatch => return Err(IngestError::KeyReused),
            Cached::Miss => {}
        }
        // The decision a takeover of this key would find: nothing to do.
        let decided = Decided {
            decision: Decision::Allow,
            rule: IGNORED_RULE.into(),
            actions: Vec::new(),
            playbook_version: ignored.playbook_version,
            evaluated_at: now,
            facts: SubjectFacts::default(),
            mapping: Some(Mapping::Unmapped),
            subject: Some(subject_digest(&self.keys, tenant_id, &ignored.subject)),
            bound: Default::default(),
        };
        let claim = Claim {
            key: key_ref.clone(),
            fingerprint: fingerprint.clone(),
            event_id: Uuid::now_v7(),
            lock_token: Uuid::new_v4(),
            now,
            locked_until: now.saturating_add(self.settings.lock_timeout_ms),
            expires_at: now.saturating_add(self.settings.key_ttl_ms),
            ruling: record::json(&decided),
        };
        let holding = |event_id, decided, expires_at| Holding {
            held: HeldKey {
                key: key_ref.clone(),
                lock_token: claim.lock_token,
            },
            event_id,
            decided,
            expires_at,
        };
        let holding = if self.commits.claim(claim.clone(), &Approach::none()).await? {
            holding(claim.event_id, decided, claim.expires_at)
        } else {
            match self.store.claim(&claim).await? {
                ClaimOutcome::Started => holding(claim.event_id, decided, claim.expires_at),
                ClaimOutcome::TakenOver {
                    event_id,
                    from,
                    expires_at,
                } => {
                    tracing::info!(%event_id, "took over an abandoned idempotency key");
                    let taken = holding(event_id, decided, expires_at);
                    match recorded_decision(from) {
                        // Decided as a signal before the playbook stopped mapping its type: it
                        // is finished as that signal.
                        Ok(Some(
                            recorded @ Decided {
                                mapping: Some(Mapping::Type(signal_type)),
                                ..
                            },
                        )) => {
                            let mut inbound = ignored.into_signal(key, signal_type);
                            if let Some(subject) = recorded.subject {
                                inbound.signal.subject = Subject::Digested(subject);
                            }
                            let taken = Holding {
                                decided: recorded,
                                ..taken
                            };
                            return self.finish_as_signal(&inbound, &key_ref, taken).await;
                        }
                        // Recorded as ignored: finished with that record's subject, version
                        // and time.
                        Ok(Some(recorded)) => Holding {
                            decided: recorded,
                            ..taken
                        },
                        Ok(None) => taken,
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
                    self.completed.insert(
                        (tenant_id, key_ref.digest.clone()),
                        Payload {
                            fingerprint,
                            raw_body: ignored.raw_body,
                        },
                        response.clone(),
                        expires_at,
                    );
                    return Ok(Reply::Replayed(response));
                }
            }
        };
        failpoint!("ingest::after_claim");
        self.finish_ignored(ignored, &key_ref, holding).await
    }

    /// Stores an unmapped feed event whose key this request holds, as an event that decided
    /// nothing, and completes the key.
    pub(super) async fn finish_ignored(
        &self,
        ignored: FeedEvent<'_>,
        key: &KeyRef,
        holding: Holding,
    ) -> Result<Reply, IngestError> {
        let tenant_id = ignored.tenant.id;
        let Holding {
            held,
            event_id,
            expires_at,
            decided,
        } = holding;
        let now = now_ms();
        let subject_hash = decided
            .subject
            .unwrap_or_else(|| subject_digest(&self.keys, tenant_id, &ignored.subject))
            .to_vec();
        let event = NewEvent {
            id: event_id,
            tenant_id,
            signal_type: UNMAPPED_TYPE,
            subject_hash: subject_hash.clone(),
            observed_at: to_ms(ignored.observed_at),
            attributes: record::json(&ignored.attributes),
            metadata: record::json(&ignored.metadata),
            metadata_in_callback: false,
            decision: Decision::Ignored,
            playbook_version: decided.playbook_version,
            rule: IGNORED_RULE.into(),
            actions: "[]".into(),
            created_at: now,
            evaluated_at: decided.evaluated_at,
            facts: record::json(&SubjectFacts::default()),
            feed: ignored.feed,
            // No signal type maps it, so it has no signal key.
            signal_key: Vec::new(),
        };
        let act = Act::new(
            Some(held.clone()),
            ActionTarget {
                tenant_id,
                event_id,
                subject_hash,
                // No action runs, so nothing is keyed by the signal.
                signal_key: Vec::new(),
                observed_at: 0,
                signal_type: UNMAPPED_TYPE,
                now,
            },
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Arc::new(IgnoredDraft { event }),
        );
        match self.commits.act(act).await {
            Ok(committed) => {
                tracing::info!(%event_id, "unmapped feed event recorded as ignored");
                self.completed.insert(
                    (tenant_id, key.digest.clone()),
                    Payload {
                        fingerprint: ignored.fingerprint.0.to_vec(),
                        raw_body: ignored.raw_body,
                    },
                    committed.response.clone(),
                    expires_at,
                );
                Ok(Reply::Fresh(committed.response))
            }
            Err(err) => {
                let err = IngestError::from(err);
                self.settle_failure(&err, &held).await;
                Err(err)
            }
        }
    }
}

/// What an ignored feed event stores, whatever the outcomes: its event and an empty 202.
struct IgnoredDraft {
    event: NewEvent,
}

impl Render for IgnoredDraft {
    fn finished(&self, _: &ActOutcome) -> Finished {
        Finished {
            event: self.event.clone(),
            response: StoredResponse {
                status: 202,
                body: Vec::new(),
            },
            key_state: crate::domain::KeyState::Completed,
            locked_until: 0,
            answer_in_event: false,
        }
    }

    /// Never asked for: an ignored event has no callback.
    fn envelope(&self, _: &[(ActionKind, Applied)]) -> crate::store::EnvelopeBytes {
        crate::store::EnvelopeBytes {
            bytes: Vec::new(),
            in_event: false,
        }
    }
}
