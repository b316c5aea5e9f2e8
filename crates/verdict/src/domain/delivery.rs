//! Where a delivery stands, the state the store records after an attempt, and the
//! `webhook-id` it goes out under.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

/// Where a delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum DeliveryStatus {
    /// Waiting for an attempt (the inline one, or a retry when `next_attempt_at` comes).
    Pending,
    /// A 2xx was received.
    Succeeded,
    /// Terminal: a 4xx other than 429, a redirect, a refused destination or no URL.
    Failed,
    /// Retryable failures until the retries ran out.
    Dead,
    /// An at-most-once connector's call ended ambiguously (no answer, a timeout): it may or
    /// may not have acted, and is not retried; an operator resolves it.
    Unknown,
    /// A callback decided while the tenant's endpoint was disabled (after a 410): stored with
    /// its bytes, never attempted, and due again when the endpoint is re-enabled.
    Suspended,
}

impl DeliveryStatus {
    /// Every status, in the order the API lists them.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Succeeded,
        Self::Failed,
        Self::Dead,
        Self::Unknown,
        Self::Suspended,
    ];

    /// The stored (and shown) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Unknown => "unknown",
            Self::Suspended => "suspended",
        }
    }
}

impl DeliveryStatus {
    /// Whether no attempt will follow unless someone redelivers it (a suspended one waits for
    /// its endpoint to be re-enabled).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Pending | Self::Suspended)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a delivery status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a delivery status (expected pending, succeeded, failed, dead, unknown or \
     suspended)"
)]
pub struct UnknownStatus(pub String);

/// Decodes the stored name (for `sqlx::FromRow`).
impl TryFrom<String> for DeliveryStatus {
    type Error = <DeliveryStatus as FromStr>::Err;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        name.parse()
    }
}

impl FromStr for DeliveryStatus {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.to_owned()))
    }
}

/// What re-enabling a tenant's callback endpoint does with the callbacks suspended while it
/// was disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SuspendedCallbacks {
    /// Make them due now: each is sent once, with its stored bytes and `webhook-id`.
    Resume,
    /// Leave them suspended (an operator redelivers the ones wanted; retention prunes the rest).
    Leave,
}

/// The delivery's state after an attempt: what the store records with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    pub status: DeliveryStatus,
    pub retries_left: i64,
    pub next_attempt_at: i64,
    pub disable_endpoint: bool,
}

/// The `webhook-id` a delivery goes out under, from what its row holds: a callback's
/// (`action` is `callback`) is `msg_<event>` to the `default` endpoint (whose id is the
/// tenant's), as before there were several, and `msg_<event>_<endpoint>` to any other, so each
/// endpoint's receiver deduplicates on an id of its own; an action request's is
/// `<event>:<action>`, the idempotency key its connector is called with.
pub fn webhook_id(tenant_id: Uuid, event_id: Uuid, action: &str, endpoint_id: Uuid) -> String {
    if action != super::ActionKind::Callback.as_str() {
        format!("{event_id}:{action}")
    } else if endpoint_id == tenant_id {
        format!("msg_{}", event_id.simple())
    } else {
        format!("msg_{}_{}", event_id.simple(), endpoint_id.simple())
    }
}

/// A delivery row's stored `webhook_id`: empty when it is the one [`webhook_id`] derives from
/// the row (37 bytes fewer in each row and its WAL), else the id itself, as rows written before
/// hold it; [`read_webhook_id`] reads either back. No `webhook-id` is empty.
pub fn stored_webhook_id(
    id: &str,
    tenant_id: Uuid,
    event_id: Uuid,
    action: &str,
    endpoint_id: Uuid,
) -> String {
    if id == webhook_id(tenant_id, event_id, action, endpoint_id) {
        String::new()
    } else {
        id.to_owned()
    }
}

/// The `webhook-id` of a delivery row that stored `stored` ([`stored_webhook_id`]).
pub fn read_webhook_id(
    stored: &str,
    tenant_id: Uuid,
    event_id: Uuid,
    action: &str,
    endpoint_id: Uuid,
) -> String {
    if stored.is_empty() {
        webhook_id(tenant_id, event_id, action, endpoint_id)
    } else {
        stored.to_owned()
    }
}

#[cfg(test)]
mod webhook_id_tests {
    use proptest::prelude::*;

    use super::*;

    const TENANT: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001);
    const EVENT: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_00e1);
    const ENDPOINT: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_00d1);

    #[test]
    fn callbacks_and_action_requests_have_the_ids_receivers_always_saw() {
        assert_eq!(
            webhook_id(TENANT, EVENT, "callback", TENANT),
            "msg_019300000000700080000000000000e1"
        );
        assert_eq!(
            webhook_id(TENANT, EVENT, "callback", ENDPOINT),
            "msg_019300000000700080000000000000e1_019300000000700080000000000000d1"
        );
        assert_eq!(
            webhook_id(TENANT, EVENT, "lock_account", Uuid::nil()),
            "01930000-0000-7000-8000-0000000000e1:lock_account"
        );
    }

    #[test]
    fn a_derivable_id_is_stored_empty_and_read_back_whole() {
        let id = webhook_id(TENANT, EVENT, "callback", ENDPOINT);
        let stored = stored_webhook_id(&id, TENANT, EVENT, "callback", ENDPOINT);
        assert_eq!(stored, "");
        assert_eq!(
            read_webhook_id(&stored, TENANT, EVENT, "callback", ENDPOINT),
            id
        );
    }

    proptest! {
        #[test]
        fn any_id_reads_back_as_it_was_stored(
            id in "[ -~]{1,80}",
            action in prop::sample::select(vec!["callback", "lock_account", "open_case"]),
            to_default in any::<bool>(),
        ) {
            let endpoint = if to_default { TENANT } else { ENDPOINT };
            let stored = stored_webhook_id(&id, TENANT, EVENT, action, endpoint);
            prop_assert_eq!(read_webhook_id(&stored, TENANT, EVENT, action, endpoint), id);
        }
    }
}
