//! Where a signal came in, and the feed names the playbook and the pipeline share.

use std::fmt;
use std::str::FromStr;

/// Where a signal came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Feed {
    /// `POST /v1/signals`, our own JSON.
    Signals,
    /// `POST /v1/sets`, a Security Event Token.
    Set,
    /// `POST /v1/camara/sim-swap`, a CAMARA notification.
    Camara,
}

impl Feed {
    /// Every feed.
    pub const ALL: [Self; 3] = [Self::Signals, Self::Set, Self::Camara];

    /// The stored and shown name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Signals => "signals",
            Self::Set => "set",
            Self::Camara => "camara",
        }
    }

    /// The endpoint part of its idempotency keys (of the key table's primary key): keys are
    /// scoped per tenant and feed.
    pub const fn endpoint(self) -> &'static str {
        match self {
            Self::Signals => "POST /v1/signals",
            Self::Set => "POST /v1/sets",
            Self::Camara => "POST /v1/camara/sim-swap",
        }
    }
}

/// Serialised as its stored name.
impl serde::Serialize for Feed {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Read from its stored name.
impl<'de> serde::Deserialize<'de> for Feed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse()
            .map_err(|_| serde::de::Error::custom("the feed must be camara or set"))
    }
}

impl fmt::Display for Feed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no feed's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a feed name")]
pub struct UnknownFeed;

/// Decodes the stored name (for `sqlx::FromRow`).
impl TryFrom<String> for Feed {
    type Error = UnknownFeed;

    fn try_from(name: String) -> Result<Self, UnknownFeed> {
        name.parse()
    }
}

impl FromStr for Feed {
    type Err = UnknownFeed;

    fn from_str(s: &str) -> Result<Self, UnknownFeed> {
        Self::ALL
            .into_iter()
            .find(|feed| feed.as_str() == s)
            .ok_or(UnknownFeed)
    }
}

/// The RISC event every receiver understands: a credential was compromised. The playbook maps
/// it to a signal type by default; the SET feed reads it.
pub const RISC_CREDENTIAL_COMPROMISE: &str =
    "https://schemas.openid.net/secevent/risc/event-type/credential-compromise";

/// The type a feed event no signal type maps to is stored under.
pub const UNMAPPED_TYPE: &str = "unmapped";
/// The decision such an event records: it decided nothing.
pub const IGNORED_DECISION: &str = super::Decision::Ignored.as_str();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_reads_back_from_its_name() {
        for feed in Feed::ALL {
            assert_eq!(feed.as_str().parse::<Feed>(), Ok(feed));
        }
        assert_eq!("Signals".parse::<Feed>(), Err(UnknownFeed));
    }
}
