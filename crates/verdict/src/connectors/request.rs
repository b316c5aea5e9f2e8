//! The action request: what a connector is asked to do for one event, built once when the
//! signal is decided and stored sealed with it (it holds the raw identifier the tenant's
//! system needs), then sent byte for byte on every attempt.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::domain::{Decision, SignalType};
use crate::secrets::{Keyring, SecretsError};

/// The largest action request verdict builds, in bytes: metadata is bounded by the signal's
/// own 64 KiB, and this bounds what any connector is sent.
pub const MAX_REQUEST_BYTES: usize = 80 * 1024;

/// The JSON body an HTTP connector receives (a SCIM connector reads the subject's account
/// from it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionRequest {
    /// What to do: `lock_account`, `open_case`, `alert_customer`, `charge_step_up`, `deny`,
    /// or an operator's way back: `unlock_account`, `lift_deny`, `close_case`.
    pub action: String,
    /// The event that asked for it; with `action`, the `Idempotency-Key`.
    pub event_id: Uuid,
    pub tenant: Uuid,
    /// The decision that asked for it; absent for an operator's way back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The rule that asked for it, or `operator` for an operator's way back.
    pub rule: String,
    /// The signal's type; absent for an operator's way back.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub signal_type: Option<SignalType>,
    /// Why an operator asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The subject's identifiers as the signal gave them: the only place verdict keeps them,
    /// sealed, and only until the request's outcome is final.
    pub subject: RequestSubject,
    /// The signal's metadata, untouched.
    #[schema(value_type = Object)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// The subject's raw identifiers, where the signal carried them.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RequestSubject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

/// Never prints an identifier.
impl std::fmt::Debug for RequestSubject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSubject")
            .field("phone", &self.phone.as_ref().map(|_| ".."))
            .field("account", &self.account.as_ref().map(|_| ".."))
            .finish()
    }
}

/// Associated data binding a sealed request to its event and action.
fn context(event_id: Uuid, action: &str) -> Vec<u8> {
    format!("action-request/{event_id}/{action}").into_bytes()
}

impl ActionRequest {
    /// The request's bytes as sent, sealed for storage.
    pub fn seal(&self, keys: &Keyring) -> Vec<u8> {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        keys.seal(&bytes, &context(self.event_id, &self.action))
    }
}

/// Why a stored request could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("the request was erased once its outcome was final")]
    Erased,
    #[error("the stored request does not open under this master key")]
    Unseal(#[source] SecretsError),
}

/// The bytes of a stored request for `action` of `event_id`.
pub fn open(
    keys: &Keyring,
    sealed: &[u8],
    event_id: Uuid,
    action: &str,
) -> Result<Vec<u8>, OpenError> {
    if sealed.is_empty() {
        return Err(OpenError::Erased);
    }
    keys.open(sealed, &context(event_id, action))
        .map_err(OpenError::Unseal)
}
