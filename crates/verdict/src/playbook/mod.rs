//! Playbooks: a tenant's versioned, ordered rules that turn a signal into one decision and a
//! list of actions.
//!
//! A playbook is a TOML or JSON document of `[[rule]]`s. Each rule has a `name`, a `when` table
//! of conditions that must all hold, a `decision` and `actions`. The first matching rule decides;
//! when none matches the decision is `allow` with no actions. See `playbooks/default.toml`.
//! An optional `[feeds]` table maps the standard feeds' event types to signal types.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

pub use crate::domain::Decision;
use crate::domain::{ActionKind, ConnectorName, SignalType};
use crate::signal::Signal;

mod library;
pub mod simulation;
mod validation;

pub use library::{Library, PlaybookStoreError, current_source, upload};
pub use validation::{
    MAX_ACTIONS_PER_RULE, MAX_ATTRIBUTE_NAME_CHARS, MAX_ATTRIBUTE_VALUES, MAX_BINDINGS, MAX_HOURS,
    MAX_PLAYBOOK_BYTES, MAX_RULE_NAME_CHARS, MAX_RULES, MAX_SET_EVENTS,
};

/// The source of the playbook every tenant starts with.
pub const DEFAULT_SOURCE: &str = include_str!("../../playbooks/default.toml");

/// The version number of the built-in default playbook.
pub const DEFAULT_VERSION: i64 = 0;

/// A document format a playbook may be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Toml,
    Json,
}

impl Format {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Toml => "toml",
            Self::Json => "json",
        }
    }

    /// Parses a stored name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "toml" => Some(Self::Toml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }

    /// Guesses the format of a document: JSON starts with `{`.
    pub fn sniff(source: &str) -> Self {
        if source.trim_start().starts_with('{') {
            Self::Json
        } else {
            Self::Toml
        }
    }
}

/// A validated playbook. As a JSON document (`PUT /v1/playbook` with `application/json`), the
/// schema says everything but that rule names are unique and not blank.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PlaybookDocument)]
pub struct Playbook {
    /// The rules, in order; the first whose conditions all hold decides.
    #[serde(rename = "rule", alias = "rules", default)]
    #[schema(required = true, min_items = 1, max_items = 100)]
    pub rules: Vec<Rule>,
    /// Which signal type each standard feed's event type becomes.
    #[serde(default)]
    pub feeds: FeedMapping,
    /// `[actions.<action>]`: the connector each bound action calls (at most 32). A built-in
    /// action bound to none is a record in verdict's own database, and its outcome says so; a
    /// custom action is only its connector's call.
    #[serde(default)]
    #[schema(value_type = BTreeMap<String, ActionBinding>)]
    pub actions: BTreeMap<ActionKind, ActionBinding>,
}

/// `[actions.lock_account] connector = "idp"`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionBinding {
    /// The name of one of the tenant's connectors.
    #[schema(value_type = String)]
    pub connector: ConnectorName,
}

/// `[feeds]`: e.g. `set_events = { "https://schemas.openid.net/secevent/caep/event-type/credential-change" = "credential_breach" }`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedMapping {
    /// Security Event Token event type URI → signal type. Where it names nothing, RISC
    /// `credential-compromise` is `credential_breach`; any other event type is unmapped: it is
    /// recorded as ignored and decides nothing.
    #[serde(default)]
    pub set_events: BTreeMap<String, SignalType>,
}

/// One rule: conditions, then what to decide and do.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Unique within the playbook; copied into every decision it makes.
    #[schema(min_length = 1, max_length = 64, pattern = r"\S")]
    pub name: String,
    #[serde(default)]
    pub when: Conditions,
    pub decision: Decision,
    /// Each action at most once, at most 16; a custom action (any other name) only if
    /// `[actions.<name>]` binds it to a connector.
    #[serde(default)]
    #[schema(schema_with = action_list)]
    pub actions: Vec<ActionKind>,
}

/// The schema of a rule's `actions`: no action twice.
fn action_list() -> utoipa::openapi::schema::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(utoipa::openapi::Ref::from_schema_name("ActionKind"))
        .unique_items(true)
        .max_items(Some(MAX_ACTIONS_PER_RULE))
        .build()
}

/// Conditions of a rule; all present ones must hold.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Conditions {
    /// The signal is one of these types.
    #[serde(rename = "type")]
    #[schema(min_items = 1)]
    pub types: Option<Vec<SignalType>>,
    /// `observed_at` is at most this many hours before the decision (at most ten years).
    #[schema(exclusive_minimum = 0, maximum = 87660)]
    pub observed_within_hours: Option<f64>,
    /// An RFC 3339 attribute (e.g. `swapped_at`) is within N hours of `observed_at`.
    pub attribute_within_hours: Option<AttributeWithin>,
    /// A string attribute (e.g. `to_carrier`) is one of the listed values.
    pub attribute_in: Option<AttributeIn>,
    /// A numeric attribute (e.g. `severity`) is at least this value.
    pub attribute_at_least: Option<AttributeAtLeast>,
    /// The subject does (true) or does not (false) hold an account lock.
    pub subject_locked: Option<bool>,
}

/// `attribute_within_hours = { attribute = "swapped_at", hours = 24 }`.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttributeWithin {
    #[schema(max_length = 64)]
    pub attribute: String,
    /// At most ten years.
    #[schema(exclusive_minimum = 0, maximum = 87660)]
    pub hours: f64,
}

/// `attribute_in = { attribute = "to_carrier", values = ["…"] }`.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttributeIn {
    #[schema(max_length = 64)]
    pub attribute: String,
    #[schema(min_items = 1, max_items = 100, inline = true)]
    pub values: Vec<AttributeValue>,
}

/// One value of an `attribute_in` condition.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(max_length = 256)]
pub struct AttributeValue(pub String);

/// `attribute_at_least = { attribute = "severity", value = 7 }`.
#[derive(Clone, Debug, PartialEq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttributeAtLeast {
    #[schema(max_length = 64)]
    pub attribute: String,
    pub value: f64,
}

/// Why a playbook document is refused; the message names the line, rule or field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlaybookError {
    /// Not a valid playbook: syntax, unknown names, contradictions.
    #[error("invalid playbook: {0}")]
    Invalid(String),
    /// Larger than [`MAX_PLAYBOOK_BYTES`].
    #[error("the playbook is {0} bytes; at most {MAX_PLAYBOOK_BYTES} are accepted")]
    TooLarge(usize),
    /// Valid, but past one of the limits (rules, name lengths, value ranges).
    #[error("the playbook is over a limit: {0}")]
    OverLimit(String),
}

/// What the playbook decided for one signal: the matching rule, its decision and actions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ruling {
    pub decision: Decision,
    pub actions: Vec<ActionKind>,
    pub rule: String,
}

/// What a rule can see of a signal: its type, time and attributes, never its subject. A stored
/// event holds all of it, which is what makes a simulation exact.
#[derive(Clone, Copy, Debug)]
pub struct Observation<'a> {
    pub signal_type: SignalType,
    pub observed_at: OffsetDateTime,
    pub attributes: &'a serde_json::Map<String, Value>,
}

impl<'a> Observation<'a> {
    /// What the rules see of a live signal.
    pub fn of(signal: &'a Signal) -> Self {
        Self {
            signal_type: signal.signal_type,
            observed_at: signal.observed_at,
            attributes: &signal.attributes,
        }
    }
}

/// Facts about the subject that rules may ask for, looked up only when a rule needs them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubjectFacts {
    pub locked: bool,
}

impl Playbook {
    /// Parses and validates a document.
    pub fn parse(source: &str, format: Format) -> Result<Self, PlaybookError> {
        if source.len() > MAX_PLAYBOOK_BYTES {
            return Err(PlaybookError::TooLarge(source.len()));
        }
        let playbook = Self::deserialize(source, format)?;
        // Limits first: the validation messages quote rule names.
        playbook.check_limits()?;
        playbook.validate(source)?;
        Ok(playbook)
    }

    /// Parses and validates a stored version. The limits are not applied: a version accepted
    /// before they existed must keep deciding, not fail every signal after an upgrade.
    fn parse_stored(source: &str, format: Format) -> Result<Self, PlaybookError> {
        let playbook = Self::deserialize(source, format)?;
        playbook.validate(source)?;
        Ok(playbook)
    }

    fn deserialize(source: &str, format: Format) -> Result<Self, PlaybookError> {
        let invalid = |e: &dyn std::fmt::Display| PlaybookError::Invalid(e.to_string());
        let playbook: Playbook = match format {
            Format::Toml => toml::from_str(source).map_err(|e| invalid(&e))?,
            Format::Json => serde_json::from_str(source).map_err(|e| invalid(&e))?,
        };
        Ok(playbook)
    }

    /// The connector each of `actions` is bound to.
    pub fn bindings_of(&self, actions: &[ActionKind]) -> BTreeMap<ActionKind, ConnectorName> {
        actions
            .iter()
            .filter_map(|a| Some((*a, self.actions.get(a)?.connector.clone())))
            .collect()
    }

    /// The built-in default playbook.
    pub fn default_playbook() -> &'static Playbook {
        static DEFAULT: OnceLock<Playbook> = OnceLock::new();
        DEFAULT.get_or_init(|| {
            Playbook::parse(DEFAULT_SOURCE, Format::Toml)
                .expect("the shipped default playbook is valid (a unit test checks it)")
        })
    }

    /// The signal type a Security Event Token of `event_type` becomes, if any: the playbook's
    /// own mapping, else the built-in one.
    pub fn set_event_signal(&self, event_type: &str) -> Option<SignalType> {
        self.feeds.set_events.get(event_type).copied().or_else(|| {
            (event_type == crate::domain::RISC_CREDENTIAL_COMPROMISE)
                .then_some(SignalType::CredentialBreach)
        })
    }

    /// Whether any rule needs to know if the subject is locked (a database read).
    pub fn needs_subject_facts(&self) -> bool {
        self.rules.iter().any(|r| r.when.subject_locked.is_some())
    }

    /// The first matching rule's decision and actions.
    pub fn decide(&self, signal: &Signal, facts: SubjectFacts, now: OffsetDateTime) -> Ruling {
        self.decide_observed(&Observation::of(signal), facts, now)
    }

    /// [`Playbook::decide`] on what a rule can see of a signal, live or stored.
    pub fn decide_observed(
        &self,
        signal: &Observation<'_>,
        facts: SubjectFacts,
        now: OffsetDateTime,
    ) -> Ruling {
        self.rules
            .iter()
            .find(|rule| rule.when.hold(signal, facts, now))
            .map(|rule| Ruling {
                decision: rule.decision,
                actions: rule.actions.clone(),
                rule: rule.name.clone(),
            })
            .unwrap_or(Ruling {
                decision: Decision::Allow,
                actions: Vec::new(),
                rule: "no_rule_matched".into(),
            })
    }
}

/// `h` hours; saturating, so a stored window can never panic the decision.
fn hours(h: f64) -> Duration {
    Duration::saturating_seconds_f64(h * 3600.0)
}

impl Conditions {
    /// The conditions that name a window in hours.
    fn windows(&self) -> [(&'static str, Option<f64>); 2] {
        [
            ("when.observed_within_hours", self.observed_within_hours),
            (
                "when.attribute_within_hours.hours",
                self.attribute_within_hours.as_ref().map(|a| a.hours),
            ),
        ]
    }

    fn hold(&self, signal: &Observation<'_>, facts: SubjectFacts, now: OffsetDateTime) -> bool {
        let attr = |name: &str| signal.attributes.get(name);
        self.types
            .as_ref()
            .is_none_or(|types| types.contains(&signal.signal_type))
            && self
                .observed_within_hours
                .is_none_or(|h| now - signal.observed_at <= hours(h))
            && self.attribute_within_hours.as_ref().is_none_or(|a| {
                attr(&a.attribute)
                    .and_then(Value::as_str)
                    .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
                    .is_some_and(|t| (signal.observed_at - t).abs() <= hours(a.hours))
            })
            && self.attribute_in.as_ref().is_none_or(|a| {
                attr(&a.attribute)
                    .and_then(Value::as_str)
                    .is_some_and(|v| a.values.iter().any(|x| x.0 == v))
            })
            && self.attribute_at_least.as_ref().is_none_or(|a| {
                attr(&a.attribute)
                    .and_then(Value::as_f64)
                    .is_some_and(|v| v >= a.value)
            })
            && self.subject_locked.is_none_or(|want| facts.locked == want)
    }
}

#[cfg(test)]
mod tests;
