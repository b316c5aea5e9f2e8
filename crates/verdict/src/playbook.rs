//! Playbooks: the rules that turn a signal into one decision and a list of actions.

use serde::{Deserialize, Serialize};
use time::{Duration, OffsetDateTime};

use crate::signal::{Signal, SignalType};

/// What verdict decides about a signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// A side effect a rule asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    LockAccount,
    OpenCase,
    AlertCustomer,
    ChargeStepUp,
    Deny,
    Callback,
}

/// The playbook's verdict on one signal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    pub actions: Vec<ActionKind>,
    pub playbook_version: i64,
    pub rule: &'static str,
}

/// Version number recorded for decisions made by the built-in rules.
pub const BUILT_IN_VERSION: i64 = 0;

/// How recent a SIM swap or port-out must be to deny.
const RECENT: Duration = Duration::hours(72);

/// The built-in rule set: a SIM swap or port-out observed in the last 72 h is `deny`, a breach
/// is `step_up`, anything else is `allow`.
pub fn built_in(signal: &Signal, now: OffsetDateTime) -> Outcome {
    let recent = now - signal.observed_at <= RECENT;
    let (decision, actions, rule) = match signal.signal_type {
        SignalType::SimSwap | SignalType::PortOut if recent => (
            Decision::Deny,
            vec![
                ActionKind::LockAccount,
                ActionKind::OpenCase,
                ActionKind::Deny,
                ActionKind::Callback,
            ],
            "recent_takeover_signal",
        ),
        SignalType::CredentialBreach => (
            Decision::StepUp,
            vec![
                ActionKind::AlertCustomer,
                ActionKind::ChargeStepUp,
                ActionKind::Callback,
            ],
            "breached_credential",
        ),
        _ => (Decision::Allow, vec![ActionKind::Callback], "default_allow"),
    };
    Outcome {
        decision,
        actions,
        playbook_version: BUILT_IN_VERSION,
        rule,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signal::Subject;
    use time::macros::datetime;

    fn signal(signal_type: SignalType, observed_at: OffsetDateTime) -> Signal {
        Signal {
            signal_type,
            subject: Subject::Account("a".into()),
            observed_at,
            attributes: Default::default(),
            metadata: Default::default(),
        }
    }

    #[test]
    fn recent_sim_swap_is_denied_and_old_one_allowed() {
        let now = datetime!(2026-11-30 12:00 UTC);
        let recent = built_in(&signal(SignalType::SimSwap, now - Duration::hours(1)), now);
        assert_eq!(recent.decision, Decision::Deny);
        let old = built_in(&signal(SignalType::PortOut, now - Duration::hours(73)), now);
        assert_eq!(old.decision, Decision::Allow);
    }

    #[test]
    fn breach_steps_up() {
        let now = datetime!(2026-11-30 12:00 UTC);
        let out = built_in(&signal(SignalType::CredentialBreach, now), now);
        assert_eq!(out.decision, Decision::StepUp);
    }
}
