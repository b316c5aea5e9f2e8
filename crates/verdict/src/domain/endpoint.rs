//! Callback endpoints: a tenant's receivers of decisions, each named by the tenant, with a
//! filter that says which decisions it wants.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::connector::is_slug;
use super::{Decision, Feed, SignalType};

/// The longest endpoint name.
pub const MAX_ENDPOINT_NAME_CHARS: usize = 64;

/// The name of the endpoint a tenant's callback URL is: its id is the tenant's, and it signs
/// with the tenant's webhook secrets.
pub const DEFAULT_ENDPOINT: &str = "default";

/// An endpoint's name: 1 to 64 of `a-z`, `0-9`, `_` and `-`, starting with a letter.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct EndpointName(String);

/// Why a name is not an endpoint name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "an endpoint name is 1 to {MAX_ENDPOINT_NAME_CHARS} characters of a-z, 0-9, `_` and `-`, \
     starting with a letter"
)]
pub struct InvalidEndpointName;

impl EndpointName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is the tenant's callback URL's endpoint ([`DEFAULT_ENDPOINT`]).
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_ENDPOINT
    }

    /// The tenant's callback URL's endpoint.
    pub fn default_endpoint() -> Self {
        Self(DEFAULT_ENDPOINT.to_owned())
    }
}

impl FromStr for EndpointName {
    type Err = InvalidEndpointName;

    fn from_str(s: &str) -> Result<Self, InvalidEndpointName> {
        if is_slug(s, MAX_ENDPOINT_NAME_CHARS) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidEndpointName)
        }
    }
}

impl<'de> Deserialize<'de> for EndpointName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for EndpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which decisions an endpoint receives: each list names the values it takes, and an empty
/// list takes every value. Each list holds at most its dimension's values, each once, so a
/// filter is bounded by the vocabulary.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointFilter {
    /// Signal types (`sim_swap`, `port_out`, `credential_breach`); empty: all.
    #[serde(default)]
    pub signal_types: Vec<SignalType>,
    /// Decisions (`allow`, `step_up`, `deny`); empty: all.
    #[serde(default)]
    pub decisions: Vec<Decision>,
    /// Feeds (`signals`, `set`, `camara`); empty: all.
    #[serde(default)]
    #[schema(value_type = Vec<String>)]
    pub feeds: Vec<Feed>,
}

/// Why a filter was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the filter names `{0}` twice")]
pub struct RepeatedFilterValue(String);

/// A stored filter column that names no value of its dimension.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a stored endpoint filter names `{0}`, which is not one of its values")]
pub struct UnknownFilterValue(String);

impl EndpointFilter {
    /// Whether a decision of `signal_type` from `feed` that decided `decision` goes to the
    /// endpoint.
    pub fn matches(&self, signal_type: SignalType, decision: Decision, feed: Feed) -> bool {
        takes(&self.signal_types, &signal_type)
            && takes(&self.decisions, &decision)
            && takes(&self.feeds, &feed)
    }

    /// Refuses a value named twice in one list.
    pub fn check(&self) -> Result<(), RepeatedFilterValue> {
        once(&self.signal_types, |v| v.as_str())?;
        once(&self.decisions, |v| v.as_str())?;
        once(&self.feeds, |v| v.as_str())
    }

    /// The stored columns: each list's names, comma-separated.
    pub fn columns(&self) -> [String; 3] {
        [
            joined(&self.signal_types, |v| v.as_str()),
            joined(&self.decisions, |v| v.as_str()),
            joined(&self.feeds, |v| v.as_str()),
        ]
    }

    /// The filter its stored columns describe.
    pub fn from_columns(
        signal_types: &str,
        decisions: &str,
        feeds: &str,
    ) -> Result<Self, UnknownFilterValue> {
        Ok(Self {
            signal_types: split(signal_types)?,
            decisions: split(decisions)?,
            feeds: split(feeds)?,
        })
    }

    /// Whether it takes every decision.
    pub fn is_empty(&self) -> bool {
        self.signal_types.is_empty() && self.decisions.is_empty() && self.feeds.is_empty()
    }
}

fn takes<T: PartialEq>(list: &[T], value: &T) -> bool {
    list.is_empty() || list.contains(value)
}

fn once<T>(list: &[T], name: fn(&T) -> &'static str) -> Result<(), RepeatedFilterValue> {
    for (i, value) in list.iter().enumerate() {
        if list[..i].iter().any(|earlier| name(earlier) == name(value)) {
            return Err(RepeatedFilterValue(name(value).to_owned()));
        }
    }
    Ok(())
}

fn joined<T>(list: &[T], name: fn(&T) -> &'static str) -> String {
    list.iter().map(name).collect::<Vec<_>>().join(",")
}

fn split<T: FromStr>(column: &str) -> Result<Vec<T>, UnknownFilterValue> {
    column
        .split(',')
        .filter(|part| !part.is_empty())
        .map(|part| {
            part.parse()
                .map_err(|_| UnknownFilterValue(part.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_list_takes_every_value_and_a_listed_one_only_its_own() {
        let all = EndpointFilter::default();
        assert!(all.matches(SignalType::PortOut, Decision::Allow, Feed::Camara));
        let deny_swaps = EndpointFilter {
            signal_types: vec![SignalType::SimSwap],
            decisions: vec![Decision::Deny, Decision::StepUp],
            feeds: vec![],
        };
        assert!(deny_swaps.matches(SignalType::SimSwap, Decision::Deny, Feed::Set));
        assert!(deny_swaps.matches(SignalType::SimSwap, Decision::StepUp, Feed::Signals));
        assert!(!deny_swaps.matches(SignalType::SimSwap, Decision::Allow, Feed::Signals));
        assert!(!deny_swaps.matches(SignalType::PortOut, Decision::Deny, Feed::Signals));
    }

    #[test]
    fn a_filter_reads_back_from_its_columns() {
        let filter = EndpointFilter {
            signal_types: vec![SignalType::PortOut, SignalType::CredentialBreach],
            decisions: vec![Decision::Deny],
            feeds: vec![Feed::Camara, Feed::Signals],
        };
        let [types, decisions, feeds] = filter.columns();
        assert_eq!(types, "port_out,credential_breach");
        assert_eq!(
            EndpointFilter::from_columns(&types, &decisions, &feeds),
            Ok(filter)
        );
        assert_eq!(
            EndpointFilter::from_columns("", "", ""),
            Ok(EndpointFilter::default())
        );
        assert!(EndpointFilter::from_columns("sms", "", "").is_err());
    }

    #[test]
    fn a_value_named_twice_is_refused() {
        let filter = EndpointFilter {
            decisions: vec![Decision::Deny, Decision::Deny],
            ..EndpointFilter::default()
        };
        assert_eq!(filter.check(), Err(RepeatedFilterValue("deny".to_owned())));
        assert!(serde_json::from_str::<EndpointFilter>(r#"{"decision": ["deny"]}"#).is_err());
    }

    #[test]
    fn an_endpoint_name_is_a_short_lowercase_slug() {
        assert!("fraud-ops".parse::<EndpointName>().is_ok());
        assert!("default".parse::<EndpointName>().unwrap().is_default());
        for bad in ["", "Ops", "1st", "a b", &"a".repeat(65)] {
            assert_eq!(
                bad.parse::<EndpointName>(),
                Err(InvalidEndpointName),
                "{bad}"
            );
        }
    }
}
