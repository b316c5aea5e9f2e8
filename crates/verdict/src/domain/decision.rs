//! What verdict decides about a signal.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What verdict decides about a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    StepUp,
    Deny,
    /// What a feed event no signal type maps to records: it decided nothing. No rule decides
    /// it, so a playbook cannot name it.
    #[serde(skip_deserializing)]
    Ignored,
}

impl Decision {
    /// Every decision.
    pub const ALL: [Self; 4] = [Self::Allow, Self::StepUp, Self::Deny, Self::Ignored];

    /// The wire (and stored) name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::StepUp => "step_up",
            Self::Deny => "deny",
            Self::Ignored => "ignored",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no decision's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a decision")]
pub struct UnknownDecision(pub String);

/// Decodes the stored name (for `sqlx::FromRow`).
impl TryFrom<String> for Decision {
    type Error = UnknownDecision;

    fn try_from(name: String) -> Result<Self, UnknownDecision> {
        name.parse()
    }
}

impl FromStr for Decision {
    type Err = UnknownDecision;

    fn from_str(s: &str) -> Result<Self, UnknownDecision> {
        Self::ALL
            .into_iter()
            .find(|decision| decision.as_str() == s)
            .ok_or_else(|| UnknownDecision(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_reads_back_from_its_name() {
        for value in Decision::ALL {
            assert_eq!(value.as_str().parse::<Decision>(), Ok(value));
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                serde_json::Value::from(value.as_str())
            );
        }
        assert!("nope".parse::<Decision>().is_err());
    }

    #[test]
    fn a_playbook_cannot_name_the_ignored_decision() {
        assert!(serde_json::from_str::<Decision>(r#""ignored""#).is_err());
        assert_eq!(crate::domain::IGNORED_DECISION, "ignored");
    }
}
