//! The callback envelope verdict sends: built once per delivery and repeated unchanged on every
//! retry, so its bytes' meaning and its dedup tuple are stable.

use serde::{Deserialize, Serialize};

/// One decision, as delivered to a tenant's callback URL.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Envelope {
    /// The event the decision belongs to.
    pub event_id: String,
    /// The tenant's id.
    pub tenant: String,
    /// `decision.<signal type>`, e.g. `decision.sim_swap`.
    pub event_type: String,
    /// The tenant-scoped keyed digest of the subject (hex); never the raw identifier.
    pub subject_hash: String,
    /// RFC 3339 time the decision's event was stored (to the millisecond), fixed across
    /// retries.
    pub timestamp: String,
    /// `allow`, `step_up` or `deny`.
    pub decision: String,
    /// Each action and its outcome.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub actions: serde_json::Value,
    /// The signal's metadata, untouched.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub metadata: serde_json::Value,
    /// The feed the signal came in through: `signals` (`POST /v1/signals`), `set` (a Security
    /// Event Token) or `camara` (a CAMARA notification). Envelopes from before feeds existed
    /// lack it and read as `signals`.
    #[serde(default = "signals_feed")]
    pub feed: String,
}

fn signals_feed() -> String {
    "signals".into()
}

impl Envelope {
    /// The tuple that identifies a delivery when `webhook-id` is not at hand: stable across
    /// retries, distinct between deliveries.
    pub fn dedup_tuple(&self) -> (&str, &str, &str, &str) {
        (
            &self.tenant,
            &self.event_type,
            &self.subject_hash,
            &self.timestamp,
        )
    }
}
