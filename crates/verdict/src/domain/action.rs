//! The side effects a decision can ask for. Each is idempotent on its own, so a client that
//! sends no key, or sends the same signal under several keys, still causes each effect once.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Longest custom action name, in bytes.
pub const MAX_CUSTOM_ACTION_CHARS: usize = 32;

/// The name of a custom action, one the tenant defines by binding it to a connector
/// (`[actions.notify_siem] connector = "siem"`): 1 to 32 of `a-z`, `0-9` and `_`, starting
/// with a letter, and no built-in action's name. Held inline, so an action stays `Copy`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CustomAction {
    len: u8,
    bytes: [u8; MAX_CUSTOM_ACTION_CHARS],
}

impl CustomAction {
    /// The name, if it is a valid custom action's.
    pub fn new(name: &str) -> Option<Self> {
        let valid = (1..=MAX_CUSTOM_ACTION_CHARS).contains(&name.len())
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !ActionKind::BUILT_IN.iter().any(|a| a.as_str() == name);
        if !valid {
            return None;
        }
        let mut bytes = [0; MAX_CUSTOM_ACTION_CHARS];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Some(Self {
            len: u8::try_from(name.len()).ok()?,
            bytes,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Built only from ASCII by `new`.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for CustomAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustomAction({})", self.as_str())
    }
}

/// A side effect a rule asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
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
    /// A tenant's own action: no local effect, only the call to the connector it is bound to,
    /// once per signal.
    Custom(CustomAction),
}

impl ActionKind {
    /// Every built-in action.
    pub const BUILT_IN: [ActionKind; 9] = [
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

    /// Whether it is a tenant's own action.
    pub fn is_custom(&self) -> bool {
        matches!(self, Self::Custom(_))
    }

    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Custom(name) => name.as_str(),
            built_in => built_in.built_in_name().unwrap_or_default(),
        }
    }

    /// A built-in action's name; none for a custom action.
    pub fn built_in_name(self) -> Option<&'static str> {
        Some(match self {
            Self::LockAccount => "lock_account",
            Self::OpenCase => "open_case",
            Self::AlertCustomer => "alert_customer",
            Self::ChargeStepUp => "charge_step_up",
            Self::Deny => "deny",
            Self::Callback => "callback",
            Self::UnlockAccount => "unlock_account",
            Self::LiftDeny => "lift_deny",
            Self::CloseCase => "close_case",
            Self::Custom(_) => return None,
        })
    }
}

/// A name that is no action's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not an action (a built-in one, or a custom name of 1 to 32 of a-z, 0-9 and _ \
     starting with a letter)"
)]
pub struct UnknownAction(pub String);

impl FromStr for ActionKind {
    type Err = UnknownAction;

    /// A built-in action by its name, else a custom action.
    fn from_str(s: &str) -> Result<Self, UnknownAction> {
        Self::BUILT_IN
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .or_else(|| CustomAction::new(s).map(Self::Custom))
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ActionKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ActionKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for ActionKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "A built-in action (lock_account, open_case, alert_customer, charge_step_up, \
                 deny, callback; unlock_account, lift_deny and close_case are an operator's \
                 way back) or a custom action bound to a connector in the playbook.",
            ))
            .pattern(Some("^[a-z][a-z0-9_]{0,31}$"))
            .into()
    }
}

impl utoipa::ToSchema for ActionKind {
    fn name() -> std::borrow::Cow<'static, str> {
        "ActionKind".into()
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
            // A request is never suspended (only callbacks are), but would be waiting as one.
            S::Pending | S::Suspended => Self::Pending,
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
        let custom = ActionKind::Custom(CustomAction::new("notify_siem").unwrap());
        for value in ActionKind::BUILT_IN.into_iter().chain([custom]) {
            assert_eq!(value.as_str().parse::<ActionKind>(), Ok(value));
            assert_eq!(
                serde_json::to_value(value).unwrap(),
                serde_json::Value::from(value.as_str())
            );
            let back: ActionKind = serde_json::from_value(value.as_str().into()).unwrap();
            assert_eq!(back, value);
        }
    }

    #[test]
    fn a_custom_action_name_is_short_lowercase_and_no_built_in() {
        assert!("notify_siem".parse::<ActionKind>().unwrap().is_custom());
        assert!(!"lock_account".parse::<ActionKind>().unwrap().is_custom());
        let longest = format!("a{}", "b".repeat(MAX_CUSTOM_ACTION_CHARS - 1));
        assert!(longest.parse::<ActionKind>().is_ok());
        for bad in [
            "",
            "Notify",
            "9lives",
            "_x",
            "notify-siem",
            "notify siem",
            "ünï",
            &format!("{longest}c"),
        ] {
            assert!(bad.parse::<ActionKind>().is_err(), "{bad:?} was taken");
        }
    }
}
