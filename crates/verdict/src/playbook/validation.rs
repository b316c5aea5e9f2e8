//! What a playbook must be to be accepted: well formed (names, actions, windows, event type
//! URIs) and, for an upload, within the size limits (`MAX_*`), checked before anything quotes
//! a rule's name.

use super::{Playbook, PlaybookError, Rule};
use crate::domain::{ActionKind, ConnectorKind};
use crate::store::ConnectorRecord;

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
/// Most actions one rule may ask for.
pub const MAX_ACTIONS_PER_RULE: usize = 16;
/// Most `[actions.*]` bindings a playbook may have.
pub const MAX_BINDINGS: usize = 32;

impl Playbook {
    /// Whether the document (parsed from `source`) is well formed: rule names, actions,
    /// windows and event type URIs.
    pub(super) fn validate(&self, source: &str) -> Result<(), PlaybookError> {
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
            if let Some(undo) = rule.actions.iter().find(|a| a.undoes().is_some()) {
                return Err(at(format!(
                    "`{}` is an operator's way back (`POST /v1/subjects/…`), not a rule's action",
                    undo.as_str()
                )));
            }
            let mut seen = std::collections::HashSet::new();
            for action in &rule.actions {
                if !seen.insert(action) {
                    return Err(at(format!("action `{}` is listed twice", action.as_str())));
                }
                if action.is_custom() && !self.actions.contains_key(action) {
                    let line = line_of(source, &format!("\"{action}\""))
                        .map(|n| format!("line {n}: "))
                        .unwrap_or_default();
                    return Err(PlaybookError::Invalid(format!(
                        "{line}rule {} (`{}`): `{action}` is not a built-in action, and a \
                         custom action must be bound to a connector \
                         (`[actions.{action}] connector = \"…\"`)",
                        i + 1,
                        rule.name
                    )));
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
        if let Some(undo) = self.actions.keys().find(|a| a.undoes().is_some()) {
            return Err(PlaybookError::Invalid(format!(
                "`actions.{}`: an operator's way back calls the connector its action's binding \
                 names (`actions.{}`)",
                undo.as_str(),
                undo.undoes().map(|a| a.to_string()).unwrap_or_default()
            )));
        }
        if self.actions.contains_key(&ActionKind::Callback) {
            return Err(PlaybookError::Invalid(
                "`actions.callback`: the callback goes to the tenant's callback endpoint and \
                 binds to no connector"
                    .into(),
            ));
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

    /// Whether every action binding names one of the tenant's `connectors`, of a kind that can
    /// carry out that action; the error names the binding and the line of `source` it is on.
    pub fn check_bindings(
        &self,
        source: &str,
        connectors: &[ConnectorRecord],
    ) -> Result<(), PlaybookError> {
        for (action, binding) in &self.actions {
            let name = &binding.connector;
            let at = |msg: String| {
                let line = line_of(source, &format!("\"{name}\""))
                    .or_else(|| line_of(source, &format!("actions.{}", action.as_str())));
                let line = line.map(|n| format!("line {n}: ")).unwrap_or_default();
                PlaybookError::Invalid(format!("{line}`actions.{}`: {msg}", action.as_str()))
            };
            let Some(connector) = connectors.iter().find(|c| &c.name == name) else {
                return Err(at(format!(
                    "the tenant has no connector named `{name}` (set it with \
                     `PUT /v1/connectors/{name}` first)"
                )));
            };
            if connector.kind == ConnectorKind::Scim && !matches!(action, ActionKind::LockAccount) {
                return Err(at(format!(
                    "`{name}` is a SCIM connector, which can lock accounts only"
                )));
            }
        }
        Ok(())
    }

    /// The size limits on what a tenant may upload.
    pub(super) fn check_limits(&self) -> Result<(), PlaybookError> {
        if self.rules.len() > MAX_RULES {
            return Err(PlaybookError::OverLimit(format!(
                "it has {} rules; at most {MAX_RULES} are accepted",
                self.rules.len()
            )));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            rule.check_limits(i + 1)?;
        }
        if self.actions.len() > MAX_BINDINGS {
            return Err(PlaybookError::OverLimit(format!(
                "`actions` binds {} actions; at most {MAX_BINDINGS} are accepted",
                self.actions.len()
            )));
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
        if self.actions.len() > MAX_ACTIONS_PER_RULE {
            return Err(over(format!(
                "`actions` lists {} actions; at most {MAX_ACTIONS_PER_RULE} are accepted",
                self.actions.len()
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

/// The 1-based number of the first line of `source` that contains `needle`.
fn line_of(source: &str, needle: &str) -> Option<usize> {
    source
        .lines()
        .position(|line| line.contains(needle))
        .map(|i| i + 1)
}
