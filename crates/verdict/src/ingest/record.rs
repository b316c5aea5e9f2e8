//! What a decided signal stores once its effects are known, built inside its commit: the
//! callback's envelope, the event row and the response.

use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Decided, DecisionRecord, Inbound};
use crate::clock::{now_ms, to_ms};
use crate::domain::stored_actions::stored_form;
use crate::domain::{
    ActionKind, ActionResult, Applied, CallbackEnvelope, Feed, KeyState, Outcome, SignalAnswer,
};
use crate::secrets::hex;
use crate::store::{
    ActOutcome, ActionTarget, EnvelopeBytes, Finished, NewEvent, Render, StoredResponse,
};

/// The success body of `POST /v1/signals`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SignalResponse {
    pub event_id: Uuid,
    pub subject_hash: String,
    #[serde(flatten)]
    pub record: DecisionRecord,
}

/// Everything about a decided signal except its effects' outcomes, owned so the group commit
/// can finish it.
pub(super) struct Draft {
    event_id: Uuid,
    tenant_id: Uuid,
    signal_type: &'static str,
    subject_hash: Vec<u8>,
    signal_key: Vec<u8>,
    observed_at: i64,
    attributes: String,
    metadata: serde_json::Map<String, serde_json::Value>,
    decided: Decided,
    feed: Feed,
    /// Why the decision's callback cannot be recorded, if it cannot.
    pub(super) callback_refusal: Option<&'static str>,
    /// Whether its callback is stored suspended (the endpoint is disabled): `pending` until
    /// the endpoint is re-enabled.
    pub(super) callback_suspended: bool,
    /// Until when a key left `dispatched` stays locked to this request.
    lock_until: i64,
    /// When its event is stored (unix ms), fixed once: the callback envelope's timestamp.
    created_at: i64,
    /// The last envelope rendered: for which local outcomes, and whether its event renders
    /// it. Where the metadata is stored follows from that, and the commit asks for the
    /// envelope before the event of the same outcomes. Keyed by the outcomes alone: every
    /// other field is fixed once the draft is shared with the commit.
    last_envelope: Mutex<Option<RenderedEnvelope>>,
}

/// What a rendering of the callback's envelope found.
struct RenderedEnvelope {
    /// The local outcomes it was rendered for.
    effects: Vec<(ActionKind, Applied)>,
    /// Whether its event renders it again byte for byte.
    in_event: bool,
}

impl Draft {
    pub(super) fn new(
        inbound: &Inbound<'_>,
        target: &ActionTarget,
        decided: Decided,
        callback_refusal: Option<&'static str>,
        lock_until: i64,
    ) -> Self {
        Self {
            event_id: target.event_id,
            tenant_id: target.tenant_id,
            signal_type: target.signal_type,
            subject_hash: target.subject_hash.clone(),
            signal_key: target.signal_key.clone(),
            observed_at: to_ms(inbound.signal.observed_at),
            attributes: json(&inbound.signal.attributes),
            metadata: inbound.signal.metadata.clone(),
            decided,
            feed: inbound.feed,
            callback_refusal,
            callback_suspended: false,
            lock_until,
            created_at: now_ms(),
            last_envelope: Mutex::new(None),
        }
    }

    /// Each action the decision asked for, in its order, with how it came out: a bound
    /// action whose request this event holds is `pending` until its call answers.
    fn record(&self, outcome: &ActOutcome) -> DecisionRecord {
        let actions = self
            .decided
            .actions
            .iter()
            .map(|&action| {
                let connector = self.decided.bound.get(&action).cloned();
                let outcome = match action {
                    ActionKind::Callback => match (self.callback_refusal, outcome.callback) {
                        (Some(why), _) => Outcome::Failed(why.to_owned()),
                        (None, Some(Applied::Done)) if self.callback_suspended => Outcome::Pending,
                        (None, Some(applied)) => applied.into(),
                        (None, None) => Outcome::Failed("not recorded".into()),
                    },
                    _ if outcome.requests.iter().any(|(a, _)| *a == action) => Outcome::Pending,
                    // Its request is one per signal: another event of this signal holds it.
                    ActionKind::Custom(_) => Outcome::AlreadyDone,
                    _ => match outcome.effects.iter().find(|(a, _)| *a == action) {
                        // Bound, applied, but another event holds the call: that event's.
                        Some((_, Applied::Done)) if connector.is_some() => Outcome::AlreadyDone,
                        Some(&(_, applied)) => applied.into(),
                        None => Outcome::Failed("not applied".into()),
                    },
                };
                ActionResult {
                    action,
                    outcome,
                    connector,
                }
            })
            .collect();
        DecisionRecord {
            decision: self.decided.decision,
            playbook_version: self.decided.playbook_version,
            rule: self.decided.rule.clone(),
            actions,
        }
    }
}

impl Draft {
    /// The envelope's columns, as its event's row stores them.
    fn callback_envelope(&self) -> CallbackEnvelope<'_> {
        CallbackEnvelope {
            event_id: self.event_id,
            tenant_id: self.tenant_id,
            signal_type: self.signal_type,
            subject_hash: &self.subject_hash,
            created_at: self.created_at,
            decision: self.decided.decision.as_str(),
            metadata: &self.metadata,
            feed: self.feed.as_str(),
        }
    }

    /// Whether the event stored for these local outcomes renders `bytes` again. Never with a
    /// connector's call among its actions (bound or custom): its event's outcomes change when
    /// the call answers.
    fn envelope_in_event(&self, effects: &[(ActionKind, Applied)], bytes: &[u8]) -> bool {
        if !self.decided.bound.is_empty() || self.decided.actions.iter().any(|a| a.is_custom()) {
            return false;
        }
        let outcome = ActOutcome {
            effects: effects.to_vec(),
            callback: Some(Applied::Done),
            ..ActOutcome::default()
        };
        let actions = self.record(&outcome).actions;
        let stored = stored_form(&actions, &json(&actions));
        // The metadata as the event's row gives it back.
        let Ok(metadata) = serde_json::from_str(&json(&self.metadata)) else {
            return false;
        };
        CallbackEnvelope {
            metadata: &metadata,
            ..self.callback_envelope()
        }
        .render_from_event(&stored)
        .is_ok_and(|from_event| from_event == bytes)
    }
}

impl Draft {
    /// Whether the envelope for these local outcomes is rendered from its event: the answer
    /// the commit's own rendering of it gave, else a rendering now.
    fn envelope_renders_from_event(&self, effects: &[(ActionKind, Applied)]) -> bool {
        let remembered = self.last_envelope.lock().ok().and_then(|last| {
            last.as_ref()
                .filter(|rendered| rendered.effects == effects)
                .map(|rendered| rendered.in_event)
        });
        remembered.unwrap_or_else(|| self.envelope(effects).in_event)
    }
}

impl Render for Draft {
    /// The callback envelope: its timestamp is the event's, and its bytes are repeated
    /// unchanged on every retry and redelivery, from the outbox row or rendered again from
    /// the event's.
    fn envelope(&self, effects: &[(ActionKind, Applied)]) -> EnvelopeBytes {
        // A bound action's own effect is its connector's call, which has not answered yet.
        let actions: Vec<ActionResult> = effects
            .iter()
            .map(|&(action, applied)| {
                let connector = self.decided.bound.get(&action).cloned();
                let outcome = match applied {
                    Applied::Done if connector.is_some() => Outcome::Pending,
                    applied => applied.into(),
                };
                ActionResult {
                    action,
                    outcome,
                    connector,
                }
            })
            .collect();
        let bytes = self.callback_envelope().render(&actions);
        let in_event = self.envelope_in_event(effects, &bytes);
        if let Ok(mut last) = self.last_envelope.lock() {
            *last = Some(RenderedEnvelope {
                effects: effects.to_vec(),
                in_event,
            });
        }
        EnvelopeBytes { bytes, in_event }
    }

    /// The event and the response, from the effects' outcomes.
    fn finished(&self, outcome: &ActOutcome) -> Finished {
        let record = self.record(outcome);
        // Stored once: in the callback's envelope when this event has an outbox row of its
        // own that keeps the envelope's bytes (for every retry, pruned with the event), else
        // here (the envelope is then rendered from this row).
        let metadata_in_callback = outcome.callback == Some(Applied::Done)
            && !self.metadata.is_empty()
            && !self.envelope_renders_from_event(&outcome.effects);
        let actions = json(&record.actions);
        let stored_results = record.actions.clone();
        let key_state = if outcome.requests.is_empty() {
            KeyState::Completed
        } else {
            KeyState::Dispatched
        };
        // Rendered from the event's columns, so a completed key keeps no copy of it (a replay
        // renders it again). A dispatched key keeps its bytes: its event's outcomes change
        // when the calls answer.
        let answer = SignalAnswer {
            event_id: self.event_id,
            subject_hash: &self.subject_hash,
            decision: self.decided.decision,
            playbook_version: self.decided.playbook_version,
            rule: &self.decided.rule,
            actions: &actions,
        }
        .render();
        let answer_in_event = key_state == KeyState::Completed && answer.is_ok();
        let body = answer.unwrap_or_else(|_| {
            json(&SignalResponse {
                event_id: self.event_id,
                subject_hash: hex(&self.subject_hash),
                record,
            })
            .into_bytes()
        });
        Finished {
            event: NewEvent {
                id: self.event_id,
                tenant_id: self.tenant_id,
                signal_type: self.signal_type,
                subject_hash: self.subject_hash.clone(),
                observed_at: self.observed_at,
                attributes: self.attributes.clone(),
                metadata: if metadata_in_callback {
                    String::new()
                } else {
                    json(&self.metadata)
                },
                metadata_in_callback,
                decision: self.decided.decision,
                playbook_version: self.decided.playbook_version,
                rule: self.decided.rule.clone(),
                actions: stored_form(&stored_results, &actions),
                created_at: self.created_at,
                evaluated_at: self.decided.evaluated_at,
                facts: json(&self.decided.facts),
                feed: self.feed,
                signal_key: self.signal_key.clone(),
            },
            response: StoredResponse { status: 200, body },
            key_state,
            locked_until: self.lock_until,
            answer_in_event,
        }
    }
}

/// Serialises our own types and JSON maps, which cannot fail: no non-string map keys and no
/// failing `Serialize` impls.
pub(super) fn json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("serialising owned JSON-safe values cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Decision;

    #[test]
    fn the_answer_rendered_from_the_event_is_the_signal_response_byte_for_byte() {
        let record = DecisionRecord {
            decision: Decision::StepUp,
            playbook_version: 7,
            rule: "recent \"port\" out".into(),
            actions: vec![
                ActionResult {
                    action: ActionKind::Deny,
                    outcome: Outcome::Failed("not applied: é".into()),
                    connector: None,
                },
                ActionResult {
                    action: ActionKind::Callback,
                    outcome: Outcome::Pending,
                    connector: Some("cases".parse().unwrap()),
                },
            ],
        };
        let event_id = Uuid::now_v7();
        let subject_hash = [0x0f_u8, 0xa0, 0x42];
        let actions = json(&record.actions);
        let rendered = SignalAnswer {
            event_id,
            subject_hash: &subject_hash,
            decision: record.decision,
            playbook_version: record.playbook_version,
            rule: &record.rule,
            actions: &actions,
        }
        .render()
        .unwrap();
        let response = SignalResponse {
            event_id,
            subject_hash: hex(&subject_hash),
            record,
        };
        assert_eq!(rendered, json(&response).into_bytes());
    }
}
