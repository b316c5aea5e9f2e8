//! A decision callback's envelope, rendered from what its event stores: a callback whose
//! envelope this rendering reproduces keeps no bytes of its own in the outbox, and every
//! retry and redelivery renders the same bytes again from the event row.

use serde_json::{Map, Value};
use uuid::Uuid;

use super::stored_actions::StoredActionsError;
use super::{ActionKind, ActionResult};

/// The columns of an event that its callback's envelope is made of, but its actions.
#[derive(Clone, Copy, Debug)]
pub struct CallbackEnvelope<'a> {
    pub event_id: Uuid,
    pub tenant_id: Uuid,
    pub signal_type: &'a str,
    pub subject_hash: &'a [u8],
    /// When the event was stored (unix ms): the envelope's `timestamp`.
    pub created_at: i64,
    pub decision: &'a str,
    pub metadata: &'a Map<String, Value>,
    pub feed: &'a str,
}

impl CallbackEnvelope<'_> {
    /// The envelope's bytes with these action outcomes.
    pub fn render(&self, actions: &[ActionResult]) -> Vec<u8> {
        let envelope = verdict_webhooks::Envelope {
            event_id: self.event_id.to_string(),
            tenant: self.tenant_id.to_string(),
            event_type: format!("decision.{}", self.signal_type),
            subject_hash: super::hex(self.subject_hash),
            timestamp: super::UnixMillis::new(self.created_at).rfc3339(),
            decision: self.decision.to_owned(),
            // Neither can fail: action results are strings, and the metadata is JSON already.
            actions: serde_json::to_value(actions).unwrap_or_default(),
            metadata: Value::Object(self.metadata.clone()),
            feed: self.feed.to_owned(),
        };
        serde_json::to_vec(&envelope).unwrap_or_default()
    }

    /// The envelope as the event's stored `actions` column gives it: every action's outcome
    /// but the callback's own (the envelope is built before the callback has one). Fails
    /// only if the stored actions are not action results.
    pub fn render_from_event(&self, stored_actions: &str) -> Result<Vec<u8>, StoredActionsError> {
        let json = super::stored_actions::as_json(stored_actions)?;
        let mut actions: Vec<ActionResult> = serde_json::from_str(&json)?;
        actions.retain(|a| a.action != ActionKind::Callback);
        Ok(self.render(&actions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Outcome;

    fn envelope(metadata: &Map<String, Value>) -> CallbackEnvelope<'_> {
        CallbackEnvelope {
            event_id: Uuid::nil(),
            tenant_id: Uuid::max(),
            signal_type: "sim_swap",
            subject_hash: &[0xab, 0x01],
            created_at: 1_764_960_000_123,
            decision: "deny",
            metadata,
            feed: "signals",
        }
    }

    #[test]
    fn the_envelope_from_the_event_leaves_out_the_callbacks_own_outcome() {
        let metadata = Map::new();
        let lock = ActionResult {
            action: ActionKind::LockAccount,
            outcome: Outcome::Done,
            connector: None,
        };
        let callback = ActionResult {
            action: ActionKind::Callback,
            outcome: Outcome::Done,
            connector: None,
        };
        let stored = serde_json::to_string(&[&lock, &callback]).unwrap();
        let from_event = envelope(&metadata).render_from_event(&stored).unwrap();
        assert_eq!(from_event, envelope(&metadata).render(&[lock]));
        assert_eq!(
            String::from_utf8(from_event).unwrap(),
            r#"{"event_id":"00000000-0000-0000-0000-000000000000","tenant":"ffffffff-ffff-ffff-ffff-ffffffffffff","event_type":"decision.sim_swap","subject_hash":"ab01","timestamp":"2025-12-05T18:40:00.123Z","decision":"deny","actions":[{"action":"lock_account","outcome":"done"}],"metadata":{},"feed":"signals"}"#
        );
    }

    #[test]
    fn stored_actions_that_are_not_json_are_refused() {
        let metadata = Map::new();
        assert!(envelope(&metadata).render_from_event("[").is_err());
    }
}
