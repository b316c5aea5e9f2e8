//! The kinds of identity-risk signal.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The kinds of identity-risk signal verdict understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignalType {
    SimSwap,
    PortOut,
    CredentialBreach,
}

impl SignalType {
    /// Every signal type.
    pub const ALL: [Self; 3] = [Self::SimSwap, Self::PortOut, Self::CredentialBreach];

    /// The wire name, as stored and sent in callbacks.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::SimSwap => "sim_swap",
            Self::PortOut => "port_out",
            Self::CredentialBreach => "credential_breach",
        }
    }
}

impl fmt::Display for SignalType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no signal type's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a signal type")]
pub struct UnknownSignalType(pub String);

/// Decodes the stored name (for `sqlx::FromRow`).
impl TryFrom<String> for SignalType {
    type Error = UnknownSignalType;

    fn try_from(name: String) -> Result<Self, UnknownSignalType> {
        name.parse()
    }
}

impl FromStr for SignalType {
    type Err = UnknownSignalType;

    fn from_str(s: &str) -> Result<Self, UnknownSignalType> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownSignalType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_type_reads_back_from_its_name() {
        for value in SignalType::ALL {
            assert_eq!(value.as_str().parse::<SignalType>(), Ok(value));
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                serde_json::Value::from(value.as_str())
            );
        }
        assert!("nope".parse::<SignalType>().is_err());
    }
}
