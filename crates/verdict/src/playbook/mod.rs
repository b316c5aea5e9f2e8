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

use crate::actions::ActionKind;
use crate::signal::{Signal, SignalType};

mod library;
pub mod simulation;

pub use library::{Library, PlaybookStoreError, current_source, upload};

/// What verdict decides about a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    StepUp,
    Deny,
}

impl Decision {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::StepUp => "step_up",
            Self::Deny => "deny",
        }
    }
}

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
    /// Each action at most once.
    #[serde(default)]
    #[schema(schema_with = action_list)]
    pub actions: Vec<ActionKind>,
}

/// The schema of a rule's `actions`: no action twice.
fn action_list() -> utoipa::openapi::schema::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(utoipa::openapi::Ref::from_schema_name("ActionKind"))
        .unique_items(true)
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

/// Largest playbook document accepted, in bytes.
pub const MAX_PLAYBOOK_BYTES: usize = 64 * 1024;
/// Most rules a playbook may have.
pub const MAX_RULES: usize = 100;
/// Longest rule name, in characters: the name is copied into every response and event.
pub const MAX_RULE_NAME_CHARS: usize = 64;
/// Longest attribute name a condition may name, in characters.
pub const MAX_ATTRIBUTE_NAME_CHARS: usize = 64;
/// Most values an `attribute_in` condition may list, and the longest of them.
pub const MAX_ATTRIBUTE_VALUES: usize = 100;
const MAX_ATTRIBUTE_VALUE_CHARS: usize = 256;
/// Longest window a condition may name: ten years, in hours.
pub const MAX_HOURS: f64 = 10.0 * 365.25 * 24.0;
/// Most SET event types `[feeds] set_events` may map, and the longest URI.
pub const MAX_SET_EVENTS: usize = 50;
const MAX_EVENT_TYPE_CHARS: usize = 256;

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
        playbook.validate()?;
        Ok(playbook)
    }

    /// Parses and validates a stored version. The limits are not applied: a version accepted
    /// before they existed must keep deciding, not fail every signal after an upgrade.
    fn parse_stored(source: &str, format: Format) -> Result<Self, PlaybookError> {
        let playbook = Self::deserialize(source, format)?;
        playbook.validate()?;
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

    /// The built-in default playbook.
    pub fn default_playbook() -> &'static Playbook {
        static DEFAULT: OnceLock<Playbook> = OnceLock::new();
        DEFAULT.get_or_init(|| {
            Playbook::parse(DEFAULT_SOURCE, Format::Toml)
                .expect("the shipped default playbook is valid (a unit test checks it)")
        })
    }

    fn validate(&self) -> Result<(), PlaybookError> {
        if self.rules.is_empty() {
            return Err(PlaybookError::Invalid(
                "a playbook needs at least one [[rule]]".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, rule) in self.rules.iter().enumerate() {
            let at = |msg: String| {
                PlaybookError::Invalid(format!("rule {} (`{}`): {msg}", i + 1, rule.name))
            };
            if rule.name.trim().is_empty() {
                return Err(PlaybookError::Invalid(format!(
                    "rule {}: `name` must not be empty",
                    i + 1
                )));
            }
            if !names.insert(rule.name.as_str()) {
                return Err(at("another rule has the same name".into()));
            }
            let mut seen = std::collections::HashSet::new();
            for action in &rule.actions {
                if !seen.insert(action) {
                    return Err(at(format!("action `{}` is listed twice", action.as_str())));
                }
            }
            let w = &rule.when;
            for (field, value) in w.windows() {
                if value.is_some_and(|h| !h.is_finite() || h <= 0.0) {
                    return Err(at(format!("`{field}` must be a positive number")));
                }
            }
            if w.attribute_at_least
                .as_ref()
                .is_some_and(|a| !a.value.is_finite())
            {
                return Err(at(
                    "`when.attribute_at_least.value` must be a finite number".into(),
                ));
            }
            if w.types.as_ref().is_some_and(Vec::is_empty) {
                return Err(at("`when.type` must list at least one signal type".into()));
            }
            if w.attribute_in.as_ref().is_some_and(|a| a.values.is_empty()) {
                return Err(at("`when.attribute_in.values` must not be empty".into()));
            }
        }
        for uri in self.feeds.set_events.keys() {
            if !is_absolute_uri(uri) {
                return Err(PlaybookError::Invalid(format!(
                    "`feeds.set_events`: `{uri}` is not an absolute URI (an event type URI \
                     such as https://schemas.openid.net/secevent/risc/event-type/…)"
                )));
            }
        }
        Ok(())
    }

    /// The size limits on what a tenant may upload.
    fn check_limits(&self) -> Result<(), PlaybookError> {
        if self.rules.len() > MAX_RULES {
            return Err(PlaybookError::OverLimit(format!(
                "it has {} rules; at most {MAX_RULES} are accepted",
                self.rules.len()
            )));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            rule.check_limits(i + 1)?;
        }
        let events = &self.feeds.set_events;
        if events.len() > MAX_SET_EVENTS
            || events
                .keys()
                .any(|uri| uri.chars().count() > MAX_EVENT_TYPE_CHARS)
        {
            return Err(PlaybookError::OverLimit(format!(
                "`feeds.set_events` may map at most {MAX_SET_EVENTS} event types of at most \
                 {MAX_EVENT_TYPE_CHARS} characters"
            )));
        }
        Ok(())
    }

    /// The signal type a Security Event Token of `event_type` becomes, if any: the playbook's
    /// own mapping, else the built-in one.
    pub fn set_event_signal(&self, event_type: &str) -> Option<SignalType> {
        self.feeds.set_events.get(event_type).copied().or_else(|| {
            (event_type == crate::feeds::set::RISC_CREDENTIAL_COMPROMISE)
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

/// `scheme:rest` with an RFC 3986 scheme: what an event type URI must look like.
fn is_absolute_uri(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once(':') else {
        return false;
    };
    !rest.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        && !uri.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `h` hours; saturating, so a stored window can never panic the decision.
fn hours(h: f64) -> Duration {
    Duration::saturating_seconds_f64(h * 3600.0)
}

impl Rule {
    /// The size limits; checked before anything quotes the rule's name.
    fn check_limits(&self, number: usize) -> Result<(), PlaybookError> {
        let over = |msg: String| PlaybookError::OverLimit(format!("rule {number}: {msg}"));
        let too_long = |s: &str, max: usize| s.chars().count() > max;
        if too_long(&self.name, MAX_RULE_NAME_CHARS) {
            return Err(over(format!(
                "`name` is longer than {MAX_RULE_NAME_CHARS} characters"
            )));
        }
        let w = &self.when;
        let attributes = [
            w.attribute_within_hours.as_ref().map(|a| &a.attribute),
            w.attribute_in.as_ref().map(|a| &a.attribute),
            w.attribute_at_least.as_ref().map(|a| &a.attribute),
        ];
        if attributes
            .into_iter()
            .flatten()
            .any(|a| too_long(a, MAX_ATTRIBUTE_NAME_CHARS))
        {
            return Err(over(format!(
                "an attribute name is longer than {MAX_ATTRIBUTE_NAME_CHARS} characters"
            )));
        }
        if let Some(within) = &w.attribute_in
            && (within.values.len() > MAX_ATTRIBUTE_VALUES
                || within
                    .values
                    .iter()
                    .any(|v| too_long(&v.0, MAX_ATTRIBUTE_VALUE_CHARS)))
        {
            return Err(over(format!(
                "`when.attribute_in.values` may list at most {MAX_ATTRIBUTE_VALUES} values \
                 of at most {MAX_ATTRIBUTE_VALUE_CHARS} characters"
            )));
        }
        for (field, value) in w.windows() {
            if value.is_some_and(|h| h > MAX_HOURS) {
                return Err(over(format!(
                    "`{field}` is more than {MAX_HOURS} hours (ten years)"
                )));
            }
        }
        Ok(())
    }
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
mod tests {
    use super::*;
    use crate::signal::Subject;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-11-30 12:00 UTC);

    fn signal(signal_type: SignalType, observed_at: OffsetDateTime, attributes: Value) -> Signal {
        Signal {
            signal_type,
            subject: Subject::Account("a".into()),
            observed_at,
            attributes: attributes.as_object().cloned().unwrap_or_default(),
            metadata: Default::default(),
        }
    }

    #[test]
    fn default_playbook_is_valid_and_denies_a_recent_sim_swap() {
        let pb = Playbook::default_playbook();
        let recent = signal(SignalType::SimSwap, NOW - Duration::hours(1), Value::Null);
        let v = pb.decide(&recent, SubjectFacts::default(), NOW);
        assert_eq!(
            (v.decision, v.rule.as_str()),
            (Decision::Deny, "recent_sim_swap")
        );
        let old = signal(SignalType::PortOut, NOW - Duration::hours(73), Value::Null);
        assert_eq!(
            pb.decide(&old, SubjectFacts::default(), NOW).decision,
            Decision::Allow
        );
        let breach = signal(SignalType::CredentialBreach, NOW, Value::Null);
        assert_eq!(
            pb.decide(&breach, SubjectFacts::default(), NOW).decision,
            Decision::StepUp
        );
        let locked = SubjectFacts { locked: true };
        assert_eq!(pb.decide(&old, locked, NOW).rule, "subject_already_locked");
    }

    #[test]
    fn attribute_conditions_match_as_documented() {
        let pb = Playbook::parse(
            r#"
            [[rule]]
            name = "swap_near_observation"
            when = { type = ["sim_swap"], attribute_within_hours = { attribute = "swapped_at", hours = 24 } }
            decision = "deny"
            actions = ["lock_account"]

            [[rule]]
            name = "risky_carrier"
            when = { attribute_in = { attribute = "to_carrier", values = ["burner"] } }
            decision = "step_up"

            [[rule]]
            name = "severe"
            when = { attribute_at_least = { attribute = "severity", value = 7 } }
            decision = "deny"
            "#,
            Format::Toml,
        )
        .unwrap();
        let facts = SubjectFacts::default();
        let swap = signal(
            SignalType::SimSwap,
            NOW,
            serde_json::json!({"swapped_at": "2026-11-30T01:00:00Z"}),
        );
        assert_eq!(pb.decide(&swap, facts, NOW).rule, "swap_near_observation");
        let stale = signal(
            SignalType::SimSwap,
            NOW,
            serde_json::json!({"swapped_at": "2026-11-01T01:00:00Z"}),
        );
        assert_eq!(pb.decide(&stale, facts, NOW).rule, "no_rule_matched");
        let port = signal(
            SignalType::PortOut,
            NOW,
            serde_json::json!({"to_carrier": "burner"}),
        );
        assert_eq!(pb.decide(&port, facts, NOW).decision, Decision::StepUp);
        let breach = signal(
            SignalType::CredentialBreach,
            NOW,
            serde_json::json!({"severity": 9}),
        );
        assert_eq!(pb.decide(&breach, facts, NOW).rule, "severe");
        let mild = signal(
            SignalType::CredentialBreach,
            NOW,
            serde_json::json!({"severity": 2}),
        );
        assert_eq!(pb.decide(&mild, facts, NOW).decision, Decision::Allow);
    }

    #[test]
    fn json_playbooks_parse_like_toml() {
        let pb = Playbook::parse(
            r#"{"rule":[{"name":"all","decision":"step_up","actions":["callback"]}]}"#,
            Format::Json,
        )
        .unwrap();
        assert_eq!(pb.rules[0].actions, vec![ActionKind::Callback]);
    }

    #[test]
    fn invalid_playbooks_are_refused_with_an_error_naming_the_problem() {
        let cases = [
            ("[[rule]]\nname = \"a\"\ndecision = \"maybe\"\n", "maybe"),
            (
                "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nactions = [\"launch_missiles\"]\n",
                "launch_missiles",
            ),
            (
                "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nwhen = { colour = \"red\" }\n",
                "colour",
            ),
            (
                "[[rule]]\nname = \"a\"\ndecision = \"deny\"\n[[rule]]\nname = \"a\"\ndecision = \"allow\"\n",
                "same name",
            ),
            (
                "[[rule]]\nname = \"a\"\ndecision = \"deny\"\nwhen = { observed_within_hours = -1 }\n",
                "observed_within_hours",
            ),
            ("", "at least one"),
        ];
        for (source, expected) in cases {
            let err = Playbook::parse(source, Format::Toml)
                .unwrap_err()
                .to_string();
            assert!(err.starts_with("invalid playbook"), "{err}");
            assert!(
                err.contains(expected),
                "{err:?} should mention {expected:?}"
            );
        }
        let err = Playbook::parse(
            "[[rule]]\nname = \"a\"\n\ndecision = \"maybe\"\n",
            Format::Toml,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 4"), "TOML errors name the line: {err}");
    }

    #[test]
    fn playbooks_over_a_limit_are_refused_without_quoting_the_offender() {
        let rule = |name: &str, when: &str| {
            format!("[[rule]]\nname = \"{name}\"\ndecision = \"deny\"\nwhen = {{ {when} }}\n")
        };
        let long_name = "n".repeat(MAX_RULE_NAME_CHARS + 1);
        let many: String = (0..=MAX_RULES)
            .map(|i| rule(&format!("r{i}"), ""))
            .collect();
        let values: Vec<String> = (0..=MAX_ATTRIBUTE_VALUES)
            .map(|i| format!("\"v{i}\""))
            .collect();
        let cases = [
            (rule(&long_name, ""), "`name` is longer than 64"),
            (many, "101 rules"),
            (rule("a", "observed_within_hours = 1e16"), "ten years"),
            (
                rule(
                    "a",
                    "attribute_within_hours = { attribute = \"x\", hours = 87700 }",
                ),
                "ten years",
            ),
            (
                rule(
                    "a",
                    &format!("attribute_in = {{ attribute = \"{long_name}\", values = [\"x\"] }}"),
                ),
                "attribute name",
            ),
            (
                rule(
                    "a",
                    &format!(
                        "attribute_in = {{ attribute = \"c\", values = [{}] }}",
                        values.join(",")
                    ),
                ),
                "at most 100 values",
            ),
        ];
        for (source, expected) in cases {
            let err = Playbook::parse(&source, Format::Toml).unwrap_err();
            assert!(matches!(err, PlaybookError::OverLimit(_)), "{err}");
            let text = err.to_string();
            assert!(
                text.contains(expected),
                "{text:?} should mention {expected:?}"
            );
            assert!(!text.contains(&long_name), "the error quotes the long name");
        }
        let big = format!("{}# {}\n", rule("a", ""), "x".repeat(MAX_PLAYBOOK_BYTES));
        assert!(matches!(
            Playbook::parse(&big, Format::Toml),
            Err(PlaybookError::TooLarge(_))
        ));
        assert!(Playbook::parse(&rule("a", "observed_within_hours = 87600"), Format::Toml).is_ok());
    }

    #[test]
    fn a_stored_version_from_before_the_limits_still_decides() {
        let many: String = (0..=MAX_RULES)
            .map(|i| format!("[[rule]]\nname = \"r{i}\"\ndecision = \"allow\"\n"))
            .collect();
        assert!(Playbook::parse(&many, Format::Toml).is_err());
        assert_eq!(
            Playbook::parse_stored(&many, Format::Toml)
                .unwrap()
                .rules
                .len(),
            101
        );
    }

    #[test]
    fn a_huge_window_decides_without_panicking() {
        let when = Conditions {
            observed_within_hours: Some(1e300),
            ..Conditions::default()
        };
        let signal = signal(SignalType::SimSwap, NOW, Value::Null);
        assert!(when.hold(&Observation::of(&signal), SubjectFacts::default(), NOW));
    }

    #[test]
    fn feeds_map_set_event_types_with_a_built_in_for_risc_credential_compromise() {
        const CHANGED: &str =
            "https://schemas.openid.net/secevent/risc/event-type/identifier-changed";
        let pb = Playbook::parse(
            &format!(
                "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n\n[feeds]\nset_events = {{ \"{CHANGED}\" = \"sim_swap\" }}\n"
            ),
            Format::Toml,
        )
        .unwrap();
        assert_eq!(pb.set_event_signal(CHANGED), Some(SignalType::SimSwap));
        assert_eq!(
            pb.set_event_signal(crate::feeds::set::RISC_CREDENTIAL_COMPROMISE),
            Some(SignalType::CredentialBreach)
        );
        assert_eq!(
            pb.set_event_signal(
                "https://schemas.openid.net/secevent/caep/event-type/session-revoked"
            ),
            None
        );
        assert_eq!(Playbook::default_playbook().set_event_signal(CHANGED), None);
        let json = Playbook::parse(
            &format!(r#"{{"rule":[{{"name":"a","decision":"allow"}}],"feeds":{{"set_events":{{"{CHANGED}":"port_out"}}}}}}"#),
            Format::Json,
        )
        .unwrap();
        assert_eq!(json.set_event_signal(CHANGED), Some(SignalType::PortOut));
    }

    #[test]
    fn feed_mappings_are_validated_and_bounded() {
        let with = |events: &str| {
            Playbook::parse(
                &format!(
                    "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n[feeds]\nset_events = {{ {events} }}\n"
                ),
                Format::Toml,
            )
        };
        assert!(matches!(
            with("\"not a uri\" = \"sim_swap\""),
            Err(PlaybookError::Invalid(_))
        ));
        assert!(matches!(
            with("\"urn:x\" = \"weather\""),
            Err(PlaybookError::Invalid(_))
        ));
        let long = format!("\"https://e.example/{}\" = \"sim_swap\"", "x".repeat(300));
        assert!(matches!(with(&long), Err(PlaybookError::OverLimit(_))));
        let many: Vec<String> = (0..=MAX_SET_EVENTS)
            .map(|i| format!("\"urn:e:{i}\" = \"sim_swap\""))
            .collect();
        assert!(matches!(
            with(&many.join(", ")),
            Err(PlaybookError::OverLimit(_))
        ));
        assert!(
            Playbook::parse(
                "[[rule]]\nname = \"a\"\ndecision = \"allow\"\n[feeds]\nother = 1\n",
                Format::Toml
            )
            .is_err()
        );
    }

    #[test]
    fn no_matching_rule_allows_with_no_actions() {
        let pb = Playbook::parse(
            "[[rule]]\nname = \"only_breaches\"\nwhen = { type = [\"credential_breach\"] }\ndecision = \"deny\"\n",
            Format::Toml,
        )
        .unwrap();
        let v = pb.decide(
            &signal(SignalType::SimSwap, NOW, Value::Null),
            SubjectFacts::default(),
            NOW,
        );
        assert_eq!(v.decision, Decision::Allow);
        assert!(v.actions.is_empty());
    }
}
