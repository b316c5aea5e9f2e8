//! The crate's vocabulary: values and names every layer shares. It imports nothing else from
//! the crate, so any module may import it without making a cycle.

pub mod action;
pub mod answer;
pub mod connector;
pub mod decision;
pub mod delivery;
pub mod endpoint;
pub mod envelope;
pub mod feed;
pub mod key;
pub mod reason;
pub mod signal;
pub mod stored_actions;
pub mod time;

pub use action::{ActionKind, ActionResult, Applied, Outcome, UnknownAction};
pub use answer::SignalAnswer;
pub use connector::{
    ConnectorKind, ConnectorName, Guarantee, InvalidConnectorName, MAX_CONNECTOR_NAME_CHARS,
    MatchAttribute, UnknownConnectorValue,
};
pub use decision::{Decision, UnknownDecision};
pub use delivery::{
    DeliveryStatus, Next, SuspendedCallbacks, UnknownStatus, read_webhook_id, stored_webhook_id,
    webhook_id,
};
pub use endpoint::{
    DEFAULT_ENDPOINT, EndpointFilter, EndpointName, InvalidEndpointName, MAX_ENDPOINT_NAME_CHARS,
    RepeatedFilterValue, UnknownFilterValue,
};
pub use envelope::CallbackEnvelope;
pub use feed::{Feed, IGNORED_DECISION, RISC_CREDENTIAL_COMPROMISE, UNMAPPED_TYPE, UnknownFeed};
pub use key::{KeyState, UnknownKeyState};
pub use reason::{InvalidReason, MAX_REASON_CHARS, Reason};
pub use signal::{SignalType, UnknownSignalType};
pub use time::UnixMillis;

/// Lower-case hex of `bytes` (digests shown to users, as the answer and the envelope give them).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            // Writing to a String cannot fail.
            let _ = write!(s, "{b:02x}");
            s
        })
}
