//! A signal's 200 answer, rendered from the columns its event stores: the first answer is
//! checked against this rendering, and a key whose answer it reproduces stores no bytes of its
//! own (a replay renders it again from the event row).

use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::Decision;
use super::stored_actions::StoredActionsError;

/// The columns of an event that its signal's 200 answer is made of.
#[derive(Clone, Copy, Debug)]
pub struct SignalAnswer<'a> {
    pub event_id: Uuid,
    pub subject_hash: &'a [u8],
    pub decision: Decision,
    pub playbook_version: i64,
    pub rule: &'a str,
    /// The event's `actions` column, as stored ([`super::stored_actions`]).
    pub actions: &'a str,
}

/// The body's shape: the fields of `POST /v1/signals`'s 200, in its order.
#[derive(Serialize)]
struct Body<'a> {
    event_id: Uuid,
    subject_hash: String,
    decision: Decision,
    playbook_version: i64,
    rule: &'a str,
    actions: &'a RawValue,
}

impl SignalAnswer<'_> {
    /// The answer's bytes; fails only if the stored actions are not action results.
    pub fn render(&self) -> Result<Vec<u8>, StoredActionsError> {
        let actions = super::stored_actions::as_json(self.actions)?;
        let subject_hash = super::hex(self.subject_hash);
        Ok(serde_json::to_vec(&Body {
            event_id: self.event_id,
            subject_hash,
            decision: self.decision,
            playbook_version: self.playbook_version,
            rule: self.rule,
            actions: serde_json::from_str(&actions)?,
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_actions_are_repeated_byte_for_byte() {
        let actions = r#"[{"action":"deny","outcome":"failed: \"quoted\" \u00e9"}]"#;
        let body = SignalAnswer {
            event_id: Uuid::nil(),
            subject_hash: &[0xab, 0x01],
            decision: Decision::Deny,
            playbook_version: 3,
            rule: "r\"1",
            actions,
        }
        .render()
        .unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            format!(
                r#"{{"event_id":"00000000-0000-0000-0000-000000000000","subject_hash":"ab01","decision":"deny","playbook_version":3,"rule":"r\"1","actions":{actions}}}"#
            )
        );
    }

    #[test]
    fn actions_that_are_not_json_are_refused() {
        let answer = SignalAnswer {
            event_id: Uuid::nil(),
            subject_hash: &[],
            decision: Decision::Allow,
            playbook_version: 0,
            rule: "",
            actions: "[",
        };
        assert!(answer.render().is_err());
    }
}
