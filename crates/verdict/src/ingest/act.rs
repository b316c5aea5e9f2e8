//! Phase 3, **act**: the effects, the outbox row, the event and the response in one commit
//! (with a fresh key's claim, or under a held key), then the inline attempt (phase 4).

use std::sync::Arc;

use tracing::Instrument;
use uuid::Uuid;

use super::call;
use super::phases::{self, Phase};
use super::record::Draft;
use super::{
    Decided, Destination, Holding, Inbound, Ingest, IngestError, Keying, OneCommit, Prepared, Reply,
};
use crate::clock::{now_ms, to_ms};
use crate::delivery::schedule;
use crate::domain::{ActionKind, DeliveryStatus, webhook_id};
use crate::store::failpoint::failpoint;
use crate::store::{
    Act, ActionTarget, CallbackDraft, Claim, DueDelivery, EndpointTarget, HeldKey, KeyRef,
    StoreError, StoredResponse,
};
use crate::telemetry;

impl Ingest {
    /// A fresh key's claim committed with its act: one commit, and nothing of the signal is
    /// stored unless all of it is. A transient failure is the request's (nothing was stored:
    /// the retry decides afresh, as a first request would).
    pub(super) async fn act_claiming(
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

    /// Acts on a signal whose key this request holds, caching the response it completes with
    /// or settling the key after a failure.
    pub(super) async fn act_held(
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

    /// Finishes a feed event whose key recorded it as a signal, taken over after its playbook
    /// stopped mapping its event type: as that signal, with the recorded decision.
    pub(super) async fn finish_as_signal(
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

    /// Writes the decided signal's effects, outbox row, event and response in one commit,
    /// then makes the callback's inline attempt from the stored row.
    pub(super) async fn act(
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
            observed_at: to_ms(signal.inbound.signal.observed_at),
            signal_type: signal.inbound.signal.signal_type.as_str(),
            now: now_ms(),
        };
        let signal_type = signal.inbound.signal.signal_type;
        let feed = signal.inbound.feed;
        // The endpoints that take this decision, each with its own outbox row.
        let endpoints: Vec<&EndpointTarget> = destination
            .endpoints
            .iter()
            .filter(|e| e.filter.matches(signal_type, decided.decision, feed))
            .collect();
        let mut draft = Draft::new(
            signal.inbound,
            &target,
            decided.clone(),
            callback_refusal(destination, &endpoints, decided),
            target.now.saturating_add(self.settings.lock_timeout_ms),
        );
        // A disabled endpoint's callback is stored suspended, unleased: nothing is sent until
        // the endpoint is re-enabled, and nothing is lost meanwhile.
        draft.callback_suspended = !endpoints.is_empty() && endpoints.iter().all(|e| e.disabled);
        let draft = Arc::new(draft);
        let callbacks: Vec<CallbackDraft> = if decided.wants_callback() {
            endpoints
                .iter()
                .map(|e| callback_draft(e, event_id, tenant.id, target.now))
                .collect()
        } else {
            Vec::new()
        };
        let requests = call::drafts(self, signal, event_id, decided, target.now);
        let act = Act::new(
            None,
            target,
            decided.effects(),
            callbacks,
            requests.clone(),
            draft,
        );
        let held = match &keying {
            Keying::None => None,
            Keying::Held(held) => Some(held.clone()),
            Keying::Claim(claim) => Some(HeldKey {
                key: claim.key.clone(),
                lock_token: claim.lock_token,
            }),
        };
        let act = match keying {
            Keying::None => act,
            Keying::Held(held) => Act {
                held: Some(held),
                ..act
            },
            Keying::Claim(claim) => act.claiming(claim),
        };
        // The request's part of the group commit: its wait for a batch, and the batch's commit,
        // with how many signals that commit carried.
        let span = telemetry::span!(
            "commit",
            event_id = %event_id,
            phase = "act",
            signals = tracing::field::Empty,
        );
        let shared = phases::timed(
            Phase::Commit,
            self.commits
                .act_shared(act, &signal.approach)
                .instrument(span.clone()),
        )
        .await?;
        // As i64: the trace layer exports a u64 as a string.
        span.record("signals", i64::try_from(shared.signals).unwrap_or(i64::MAX));
        let committed = shared.answer?;
        failpoint!("ingest::after_dispatch");
        metrics::counter!("verdict_decisions_total", "decision" => decided.decision.as_str())
            .increment(1);
        let decision_log = super::record_decision(
            &signal.inbound.request_span,
            event_id,
            decided.decision.as_str(),
        );
        // Only the event whose commit inserted an outbox row makes its inline attempt; a
        // duplicate's callbacks and calls are the earlier event's.
        let inline: Vec<(DueDelivery, i64)> = committed
            .deliveries
            .into_iter()
            .filter(|d| d.status == DeliveryStatus::Pending)
            .filter_map(|delivery| {
                let endpoint = destination
                    .endpoints
                    .iter()
                    .find(|e| e.id == delivery.endpoint_id)?;
                let leased_until = delivery.leased_until;
                let due = DueDelivery {
                    id: delivery.id,
                    tenant_id: tenant.id,
                    event_id,
                    stored_webhook_id: delivery.webhook_id,
                    payload: delivery.payload,
                    retries_left: schedule::MAX_RETRIES,
                    callback_url: Some(endpoint.url.clone()),
                    action: crate::delivery::CALLBACK.to_owned(),
                    connector: None,
                    endpoint_id: endpoint.id,
                    endpoint_name: Some(endpoint.name.clone()),
                    endpoint_secret: endpoint.sealed_secret.clone(),
                };
                Some((due, leased_until))
            })
            .collect();
        let calls: Vec<_> = requests
            .into_iter()
            .filter(|r| committed.outcome.requests.contains(&(r.action, true)))
            .map(|r| {
                let due = DueDelivery {
                    id: r.id,
                    tenant_id: tenant.id,
                    event_id,
                    stored_webhook_id: r.webhook_id,
                    payload: r.payload,
                    retries_left: schedule::MAX_RETRIES,
                    callback_url: None,
                    action: r.action.as_str().to_owned(),
                    connector: Some(r.connector.to_string()),
                    endpoint_id: Uuid::nil(),
                    endpoint_name: None,
                    endpoint_secret: None,
                };
                (r.action, due, r.leased_until)
            })
            .collect();
        if committed.outcome.requests.is_empty() {
            self.attempt_callbacks(inline).await;
            decision_log.answered();
            return Ok(committed.response);
        }
        // The requests are stored and the key dispatched: now the calls, beside the callbacks.
        let attempt_callback = self.attempt_callbacks(inline);
        let (_, outcomes) = tokio::join!(attempt_callback, self.call_connectors(calls));
        let completed = self
            .complete_calls(event_id, &committed.response, &outcomes, held.as_ref())
            .await;
        decision_log.answered();
        match completed {
            Ok(response) => Ok(response),
            // Without a key nothing replays it: the outcomes are the client's to see.
            Err(err) if held.is_none() => {
                tracing::warn!(error = ?err, "could not record the connector calls' outcomes");
                Ok(committed.response)
            }
            Err(err) => Err(err),
        }
    }
}

/// Why a decision's callback cannot be recorded, if it cannot: no endpoint, or none whose
/// filter takes it. A disabled endpoint's is recorded, suspended.
fn callback_refusal(
    destination: &Destination,
    taking: &[&EndpointTarget],
    decided: &Decided,
) -> Option<&'static str> {
    if !decided.wants_callback() || !taking.is_empty() {
        None
    } else if destination.endpoints.is_empty() {
        Some("no callback URL is configured")
    } else {
        Some("no callback endpoint's filter takes this decision")
    }
}

/// The outbox row of a decision's callback to one endpoint: its own id and `webhook-id`,
/// leased to the inline attempt, or suspended while the endpoint is disabled.
fn callback_draft(
    endpoint: &EndpointTarget,
    event_id: Uuid,
    tenant_id: Uuid,
    now: i64,
) -> CallbackDraft {
    CallbackDraft {
        id: Uuid::now_v7(),
        endpoint_id: endpoint.id,
        webhook_id: webhook_id(
            tenant_id,
            event_id,
            ActionKind::Callback.as_str(),
            endpoint.id,
        ),
        leased_until: if endpoint.disabled {
            0
        } else {
            now.saturating_add(crate::delivery::lease_ms())
        },
        status: if endpoint.disabled {
            DeliveryStatus::Suspended
        } else {
            DeliveryStatus::Pending
        },
    }
}
