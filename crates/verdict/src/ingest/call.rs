//! Phase 5 for a signal whose actions call the tenant's connectors: the action requests were
//! committed with the act (the key moved to `dispatched`, the recovery point), so they go out
//! now, inline and concurrently under the delivery deadline, from the stored rows; their
//! outcomes make the final response, which completes the key. A crash anywhere in between
//! leaves the stored requests: a retry that takes the key over (or the worker) sends the same
//! bytes under the same `Idempotency-Key`, never new ones.

use tokio::sync::oneshot;
use tracing::Instrument;
use uuid::Uuid;

use super::record::json;
use super::{Ingest, IngestError, Prepared, SignalResponse};
use crate::clock::now_ms;
use crate::connectors::request::{ActionRequest, RequestSubject};
use crate::delivery::attempt::Attempt;
use crate::delivery::schedule::{AttemptOutcome, Trigger};
use crate::domain::{ActionKind, Outcome, webhook_id};
use crate::signal::Subject;
use crate::store::failpoint::failpoint;
use crate::store::{CallsDone, DueDelivery, HeldKey, RequestDraft, StoreError, StoredResponse};
use crate::telemetry;

use super::Decided;

/// The action request of each bound action a decision asks for, sealed.
pub(super) fn drafts(
    ingest: &Ingest,
    signal: &Prepared<'_>,
    event_id: Uuid,
    decided: &Decided,
    now: i64,
) -> Vec<RequestDraft> {
    let inbound = signal.inbound;
    let subject = match &inbound.signal.subject {
        Subject::Phone(phone) => RequestSubject {
            phone: Some(phone.clone()),
            account: None,
        },
        Subject::Account(account) => RequestSubject {
            phone: None,
            account: Some(account.clone()),
        },
        Subject::Digested(_) => RequestSubject::default(),
    };
    decided
        .effects()
        .into_iter()
        .filter_map(|action| {
            let connector = decided.bound.get(&action)?.clone();
            let request = ActionRequest {
                action: action.as_str().to_owned(),
                event_id,
                tenant: inbound.tenant.id,
                decision: Some(decided.decision),
                rule: decided.rule.clone(),
                signal_type: Some(inbound.signal.signal_type),
                reason: None,
                subject: subject.clone(),
                metadata: inbound.signal.metadata.clone(),
            };
            Some(RequestDraft {
                action,
                connector,
                id: Uuid::now_v7(),
                webhook_id: webhook_id(inbound.tenant.id, event_id, action.as_str(), Uuid::nil()),
                payload: request.seal(&ingest.keys),
                leased_until: now.saturating_add(ingest.request_lease_ms()),
            })
        })
        .collect()
}

/// How long (ms) past the deadline a request's lease lasts for its call's record to land:
/// longer than the record is retried for (`inline::RECORD_BEFORE_LEASE_ENDS_MS`, 10 s before
/// the lease ends), so a record after a slow call still gets its retries.
const RECORD_MARGIN_MS: i64 = 15_000;

impl Ingest {
    /// How long an action request is leased to the call this instance makes: the deadline
    /// and time to record it. Short, unlike a callback's inline lease: a retry that takes over
    /// a key its holder died with waits for it (409) before calling again.
    fn request_lease_ms(&self) -> i64 {
        let deadline = self.deliverer.settings().deadline.as_millis();
        i64::try_from(deadline)
            .unwrap_or(i64::MAX)
            .saturating_add(RECORD_MARGIN_MS)
    }

    /// Calls the connectors for `requests` (leased to this request) at once, each within the
    /// deadline; returns each action's outcome so far. Each call is recorded through the group
    /// commit after it answers, in the background, as the callback's inline attempt is.
    pub(super) async fn call_connectors(
        &self,
        requests: Vec<(ActionKind, DueDelivery, i64)>,
    ) -> Vec<(ActionKind, Outcome)> {
        let deadline = self.deliverer.settings().deadline;
        let mut waiting = Vec::new();
        for (action, due, leased_until) in requests {
            let (deliverer, commits) = (self.deliverer.clone(), self.commits.clone());
            let (sent, outcome) = oneshot::channel();
            let span =
                tracing::info_span!("action", delivery_id = %due.id, action = action.as_str());
            self.background.spawn(
                async move {
                    match deliverer.send(&due, Trigger::Inline, now_ms()).await {
                        Ok((attempt, record)) => {
                            let _ = sent.send(outcome_of(&attempt));
                            super::inline::record_attempt(commits, attempt, record, leased_until)
                                .await;
                        }
                        // Left leased, then due: the worker calls it.
                        Err(err) => {
                            let _ = sent.send(Outcome::Pending);
                            tracing::warn!(error = ?err, "could not call the connector");
                        }
                    }
                }
                .instrument(span),
            );
            waiting.push((action, outcome));
        }
        let mut outcomes = Vec::new();
        let until = tokio::time::Instant::now() + deadline;
        for (action, outcome) in waiting {
            let outcome = match tokio::time::timeout_at(until, outcome).await {
                Ok(Ok(outcome)) => outcome,
                // Past the deadline (it goes on in the background) or lost: still pending.
                _ => Outcome::Pending,
            };
            outcomes.push((action, outcome));
        }
        outcomes
    }

    /// Completes a dispatched signal: the event's action outcomes and, with a key still held,
    /// the key with the final response.
    pub(super) async fn complete_calls(
        &self,
        event_id: Uuid,
        provisional: &StoredResponse,
        outcomes: &[(ActionKind, Outcome)],
        held: Option<&HeldKey>,
    ) -> Result<StoredResponse, IngestError> {
        // A failure here leaves the key `dispatched` with its calls made (and recorded).
        failpoint!("ingest::before_complete_calls");
        let response = with_outcomes(provisional, outcomes)?;
        let body: SignalResponse = serde_json::from_slice(&response.body).map_err(corrupt)?;
        let actions = json(&body.record.actions);
        // Through the group commit: on PostgreSQL it joins the batch's one statement with the
        // calls' attempt records, on SQLite the one writer's next batch.
        let done = CallsDone {
            event_id,
            actions,
            held: held.cloned(),
            response: response.clone(),
        };
        let span = telemetry::span!("commit", event_id = %event_id, phase = "calls");
        self.commits.complete_calls(done).instrument(span).await?;
        Ok(response)
    }

    /// Finishes a key a dead holder left `dispatched`: calls again each of its event's action
    /// requests still pending whose lease ended and whose retry is due (the same bytes, the
    /// same key), then completes it with the outcomes as they stand; 409 while one is not.
    pub(super) async fn resume_calls(
        &self,
        held: &HeldKey,
        event_id: Uuid,
        provisional: StoredResponse,
    ) -> Result<StoredResponse, IngestError> {
        let now = now_ms();
        let leased_until = now.saturating_add(self.request_lease_ms());
        let due = self
            .store
            .lease_requests(held.key.tenant_id, event_id, now, leased_until)
            .await?;
        // What the earlier attempts settled, for the requests not called now. One still
        // pending and not leased by us is another instance's call in flight, or a retry not
        // due yet (the schedule's, or a `Retry-After` the connector asked for): wait for it.
        let mut outcomes: Vec<(ActionKind, Outcome)> = Vec::new();
        for (action, status, error) in self
            .store
            .request_statuses(held.key.tenant_id, event_id)
            .await?
        {
            let ours = due.iter().any(|d| d.action == action.as_str());
            if status == crate::domain::DeliveryStatus::Pending && !ours {
                return Err(IngestError::InProgress);
            }
            outcomes.push((action, Outcome::of_request(status, error.as_deref())));
        }
        let calls = due
            .into_iter()
            .filter_map(|d| Some((d.action.parse::<ActionKind>().ok()?, d, leased_until)))
            .collect();
        let called = self.call_connectors(calls).await;
        for (action, outcome) in called {
            outcomes.retain(|(a, _)| *a != action);
            outcomes.push((action, outcome));
        }
        self.complete_calls(event_id, &provisional, &outcomes, Some(held))
            .await
    }
}

/// An action's outcome from its call.
pub(super) fn outcome_of(attempt: &Attempt) -> Outcome {
    match &attempt.outcome {
        AttemptOutcome::Delivered if attempt.already_done => Outcome::AlreadyDone,
        AttemptOutcome::Delivered => Outcome::Done,
        AttemptOutcome::Retryable { .. } => Outcome::Pending,
        AttemptOutcome::Unknown => Outcome::Unknown,
        AttemptOutcome::Terminal | AttemptOutcome::Gone => Outcome::Failed(
            attempt
                .error
                .clone()
                .unwrap_or_else(|| "the connector refused the request".into()),
        ),
    }
}

/// `provisional` (every call `pending`) with the calls' `outcomes`.
fn with_outcomes(
    provisional: &StoredResponse,
    outcomes: &[(ActionKind, Outcome)],
) -> Result<StoredResponse, IngestError> {
    let mut body: SignalResponse = serde_json::from_slice(&provisional.body).map_err(corrupt)?;
    for result in &mut body.record.actions {
        if result.connector.is_none() {
            continue;
        }
        if let Some((_, outcome)) = outcomes.iter().find(|(a, _)| *a == result.action) {
            result.outcome = outcome.clone();
        }
    }
    Ok(StoredResponse {
        status: provisional.status,
        body: json(&body).into_bytes(),
    })
}

fn corrupt(err: serde_json::Error) -> IngestError {
    IngestError::Store(StoreError::Corrupt(Box::new(err)))
}
