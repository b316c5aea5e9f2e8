//! Connectors: a tenant's own systems that actions call, named by the tenant and bound to
//! actions in its playbook.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a connector is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorKind {
    /// A signed POST of a fixed JSON action request, with an `Idempotency-Key`.
    Http,
    /// A SCIM 2.0 service provider (RFC 7644): find the user, PATCH `active`.
    Scim,
}

impl ConnectorKind {
    /// Every kind.
    pub const ALL: [Self; 2] = [Self::Http, Self::Scim];

    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Scim => "scim",
        }
    }
}

/// The SCIM attribute a subject's account identifier is matched against.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
pub enum MatchAttribute {
    #[default]
    #[serde(rename = "userName")]
    UserName,
    #[serde(rename = "externalId")]
    ExternalId,
}

impl MatchAttribute {
    /// Every attribute.
    pub const ALL: [Self; 2] = [Self::UserName, Self::ExternalId];

    /// The SCIM attribute's name, as stored and as a filter names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UserName => "userName",
            Self::ExternalId => "externalId",
        }
    }
}

/// What a connector promises about repeated calls, and so what verdict may do after an
/// ambiguous one (a timeout, a dropped connection).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Guarantee {
    /// It honours the `Idempotency-Key` or its effect is naturally idempotent: retried until
    /// it answers, each effect once.
    #[default]
    ExactlyOnce,
    /// Neither: never retried after an ambiguous outcome, which is recorded as `unknown` for
    /// an operator to resolve.
    AtMostOnce,
}

impl Guarantee {
    /// Every guarantee.
    pub const ALL: [Self; 2] = [Self::ExactlyOnce, Self::AtMostOnce];

    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExactlyOnce => "exactly_once",
            Self::AtMostOnce => "at_most_once",
        }
    }
}

/// A stored name that is none of an enum's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a connector {what}")]
pub struct UnknownConnectorValue {
    what: &'static str,
    value: String,
}

macro_rules! from_name {
    ($ty:ty, $what:literal) => {
        impl FromStr for $ty {
            type Err = UnknownConnectorValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownConnectorValue {
                        what: $what,
                        value: s.to_owned(),
                    })
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

from_name!(ConnectorKind, "kind");
from_name!(MatchAttribute, "match attribute");
from_name!(Guarantee, "guarantee");

/// The longest connector name.
pub const MAX_CONNECTOR_NAME_CHARS: usize = 64;

/// A connector's name: 1 to 64 of `a-z`, `0-9`, `_` and `-`, starting with a letter, so it is
/// safe in a URL path, a TOML key and a log line as it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct ConnectorName(String);

/// Why a name is not a connector name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "a connector name is 1 to {MAX_CONNECTOR_NAME_CHARS} characters of a-z, 0-9, `_` and `-`, \
     starting with a letter"
)]
pub struct InvalidConnectorName;

impl ConnectorName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ConnectorName {
    type Err = InvalidConnectorName;

    fn from_str(s: &str) -> Result<Self, InvalidConnectorName> {
        if is_slug(s, MAX_CONNECTOR_NAME_CHARS) {
            Ok(Self(s.to_owned()))
        } else {
            Err(InvalidConnectorName)
        }
    }
}

/// Whether `s` is 1 to `max` of `a-z`, `0-9`, `_` and `-`, starting with a letter: a name safe
/// in a URL path, a TOML key and a log line as it is.
pub(super) fn is_slug(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl<'de> Deserialize<'de> for ConnectorName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for ConnectorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_value_reads_back_from_its_name() {
        for kind in ConnectorKind::ALL {
            assert_eq!(kind.as_str().parse::<ConnectorKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.as_str())
            );
        }
        for attribute in MatchAttribute::ALL {
            assert_eq!(attribute.as_str().parse::<MatchAttribute>(), Ok(attribute));
            assert_eq!(
                serde_json::to_value(attribute).unwrap(),
                serde_json::Value::from(attribute.as_str())
            );
        }
        for guarantee in Guarantee::ALL {
            assert_eq!(guarantee.as_str().parse::<Guarantee>(), Ok(guarantee));
            assert_eq!(
                serde_json::to_value(guarantee).unwrap(),
                serde_json::Value::from(guarantee.as_str())
            );
        }
        assert!("smtp".parse::<ConnectorKind>().is_err());
    }

    #[test]
    fn a_connector_name_is_a_short_lowercase_slug() {
        for good in ["idp", "case-manager", "siem_2", &"a".repeat(64)] {
            assert!(good.parse::<ConnectorName>().is_ok(), "{good}");
        }
        for bad in ["", "Idp", "2fa", "-x", "a b", "a/b", "ä", &"a".repeat(65)] {
            assert_eq!(
                bad.parse::<ConnectorName>(),
                Err(InvalidConnectorName),
                "{bad}"
            );
        }
    }
}
