//! The decision, made once per signal and frozen on its claim: which rule matched, what it
//! decided and asked for, under which playbook version, at what time, with which facts.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::domain::{ActionKind, ActionResult, ConnectorName};
use crate::playbook::{Decision, SubjectFacts};
use crate::signal::SignalType;

/// A frozen decision: what every phase, retry and takeover of a signal uses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decided {
    pub decision: Decision,
    pub rule: String,
    pub actions: Vec<ActionKind>,
    pub playbook_version: i64,
    /// When the playbook evaluated the signal (unix ms).
    pub evaluated_at: i64,
    /// The subject's facts as they were before this signal.
    pub facts: SubjectFacts,
    /// What the signal was decided as; `None` in rows recorded before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping: Option<Mapping>,
    /// The digest of the subject it was decided for (a feed may resolve a retry's subject
    /// otherwise, from a subscription re-registered since); `None` in rows recorded before it
    /// was kept.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "digest")]
    pub subject: Option<[u8; 32]>,
    /// The connector each of its actions is bound to under the playbook of the decision: a
    /// retry calls the same one, whatever the playbook says by then.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bound: BTreeMap<ActionKind, ConnectorName>,
}

/// A subject digest in a recorded decision, as base64.
mod digest {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(digest: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match digest {
            Some(digest) => s.serialize_some(&STANDARD.encode(digest)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| {
                STANDARD
                    .decode(text)
                    .ok()
                    .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
                    .ok_or_else(|| D::Error::custom("a subject digest is 32 bytes in base64"))
            })
            .transpose()
    }
}

/// What a signal was decided as: its type, as sent or as a feed's event type mapped to it under
/// the playbook of the decision, or a feed event no type mapped to. A retry is finished as the
/// recorded mapping says, even if the playbook maps its event type otherwise by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mapping {
    Type(SignalType),
    Unmapped,
}

/// The decision and action outcomes: what the response reports and the event stores.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DecisionRecord {
    pub decision: Decision,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: Vec<ActionResult>,
}

impl Decided {
    /// The local actions (the callback goes through the outbox).
    pub fn effects(&self) -> Vec<ActionKind> {
        self.actions
            .iter()
            .copied()
            .filter(|&a| a != ActionKind::Callback)
            .collect()
    }

    /// Whether the decision asks for a callback.
    pub fn wants_callback(&self) -> bool {
        self.actions.contains(&ActionKind::Callback)
    }

    /// The decision a v1 row recorded with its action results (it kept no facts or time).
    pub fn from_v1_record(record: DecisionRecord) -> Self {
        Self {
            decision: record.decision,
            rule: record.rule,
            actions: record.actions.iter().map(|r| r.action).collect(),
            playbook_version: record.playbook_version,
            evaluated_at: 0,
            facts: SubjectFacts::default(),
            mapping: None,
            subject: None,
            bound: BTreeMap::new(),
        }
    }
}
