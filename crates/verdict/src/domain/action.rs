//! The side effects a decision can ask for. Each is idempotent on its own, so a client that
//! sends no key, or sends the same signal under several keys, still causes each effect once.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A side effect a rule asks for.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Lock the subject's account; a held lock is a no-op.
    LockAccount,
    /// Open a fraud case, or attach the event to the subject's open case.
    OpenCase,
    /// Alert the customer, once per subject and signal type within the alert window.
    AlertCustomer,
    /// Record a billable step-up verification, at most once per signal.
    ChargeStepUp,
    /// Issue a deny for the subject, once while a deny stands.
    Deny,
    /// Send the signed callback webhook (recorded in the outbox, delivered by the worker).
    Callback,
    /// An operator's unlock of a subject's account (never a rule's).
    UnlockAccount,
    /// An operator's lifting of a subject's standing deny (never a rule's).
    LiftDeny,
    /// An operator's closing of a subject's open case (never a rule's).
    CloseCase,
}

impl ActionKind {
    /// Every action.
    pub const ALL: [ActionKind; 9] = [
        Self::LockAccount,
        Self::OpenCase,
        Self::AlertCustomer,
        Self::ChargeStepUp,
        Self::Deny,
        Self::Callback,
        Self::UnlockAccount,
        Self::LiftDeny,
        Self::CloseCase,
    ];

    /// The way back: what an operator does to undo a rule's effect on a subject.
    pub const OPERATOR: [ActionKind; 3] = [Self::UnlockAccount, Self::LiftDeny, Self::CloseCase];

    /// The rule's effect an operator action undoes.
    pub fn undoes(self) -> Option<ActionKind> {
        match self {
            Self::UnlockAccount => Some(Self::LockAccount),
            Self::LiftDeny => Some(Self::Deny),
            Self::CloseCase => Some(Self::OpenCase),
            _ => None,
        }
    }

    /// The actions written to local tables, in the order a batch applies them.
    pub const LOCAL: [ActionKind; 5] = [
        Self::LockAccount,
        Self::OpenCase,
        Self::AlertCustomer,
        Self::ChargeStepUp,
        Self::Deny,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LockAccount => "lock_account",
            Self::OpenCase => "open_case",
            Self::AlertCustomer => "alert_customer",
            Self::ChargeStepUp => "charge_step_up",
            Self::Deny => "deny",
            Self::Callback => "callback",
            Self::UnlockAccount => "unlock_account",
            Self::LiftDeny => "lift_deny",
            Self::CloseCase => "close_case",
        }
    }
}

/// A name that is no action's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an action")]
pub struct UnknownAction(pub String);

impl FromStr for ActionKind {
    type Err = UnknownAction;

    fn from_str(s: &str) -> Result<Self, UnknownAction> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

/// How an action ended: `done`, `already_done`, `pending` (its connector call has not
/// answered yet), `unknown` (an at-most-once connector's call ended ambiguously), or
/// `failed: why`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    AlreadyDone,
    Pending,
    Unknown,
    Failed(String),
}

impl Outcome {
    /// The outcome of a connector's action request whose delivery stands at `status`.
    pub fn of_request(status: super::DeliveryStatus, last_error: Option<&str>) -> Self {
        use super::DeliveryStatus as S;
        match status {
            S::Pending => Self::Pending,
            S::Succeeded => Self::Done,
            S::Unknown => Self::Unknown,
            S::Failed | S::Dead => Self::Failed(
                last_error
                    .unwrap_or("the connector did not carry out the request")
                    .to_owned(),
            ),
        }
    }
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Done => s.serialize_str("done"),
            Self::AlreadyDone => s.serialize_str("already_done"),
            Self::Pending => s.serialize_str("pending"),
            Self::Unknown => s.serialize_str("unknown"),
            Self::Failed(why) => s.serialize_str(&format!("failed: {why}")),
        }
    }
}

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "done" => Self::Done,
            "already_done" => Self::AlreadyDone,
            "pending" => Self::Pending,
            "unknown" => Self::Unknown,
            other => Self::Failed(other.strip_prefix("failed: ").unwrap_or(other).to_owned()),
        })
    }
}

/// One action and how it ended, as recorded with the decision and returned to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionResult {
    pub action: ActionKind,
    /// `done`, `already_done`, `pending`, `unknown`, or `failed: why`.
    #[schema(value_type = String)]
    pub outcome: Outcome,
    /// The connector that carried the action out on the tenant's own system; absent for an
    /// action that is a record in verdict's own database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub connector: Option<super::ConnectorName>,
}

/// Whether a store statement applied an action or found it already applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// This event applied it (now, or in an earlier attempt of the same event).
    Done,
    /// Another event applied it first.
    AlreadyDone,
}

impl From<Applied> for Outcome {
    fn from(a: Applied) -> Self {
        match a {
            Applied::Done => Outcome::Done,
            Applied::AlreadyDone => Outcome::AlreadyDone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_reads_back_from_its_name() {
        for value in ActionKind::ALL {
            assert_eq!(value.as_str().parse::<ActionKind>(), Ok(value));
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                serde_json::Value::from(value.as_str())
            );
        }
        assert!("nope".parse::<ActionKind>().is_err());
    }
}
