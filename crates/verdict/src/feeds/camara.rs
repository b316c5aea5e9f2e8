//! CAMARA SIM Swap notifications (the `sim-swap-subscriptions` API of GSMA Open Gateway): a
//! CloudEvents 1.0 event in structured JSON, pushed to the sink the tenant gave the carrier.
//!
//! A `swapped` event is a SIM swap observed at its `time`, about `data.phoneNumber`, or, for a
//! 3-legged subscription that leaves the number out, about the phone registered for
//! `data.subscriptionId`. The subscription lifecycle events (`subscription-started`,
//! `-updated`, `-ended`, and the older `subscription-ends`) are acknowledged and decide nothing.

use serde::Deserialize;
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{natural_key, object};
use crate::idempotency::IdempotencyKey;
use crate::secrets::Keyring;
use crate::signal::{MAX_OBSERVED_AHEAD, Signal, SignalType, Subject, strict_json, validate_phone};
use crate::store::{FeedStore, StoreError};

/// The event type of a SIM swap.
pub const SWAPPED: &str = "org.camaraproject.sim-swap-subscriptions.v0.swapped";
/// The prefix of the subscription lifecycle event types.
const LIFECYCLE: &str = "org.camaraproject.sim-swap-subscriptions.v0.subscription-";

/// Longest `id`, `source` or `subscriptionId` accepted, in characters.
const MAX_ATTRIBUTE_CHARS: usize = 1024;

/// Why a body is not a notification we accept; messages name the attribute, never its value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct CamaraError(pub &'static str);

/// A CAMARA SIM Swap notification: a CloudEvents 1.0 event (structured mode). Extension
/// attributes are allowed and ignored.
#[derive(Deserialize, utoipa::ToSchema)]
#[schema(as = CamaraNotification)]
pub(crate) struct CloudEvent {
    /// Unique within `source`; (`source`, `id`) is the idempotency key.
    id: String,
    /// The carrier's notification server.
    source: String,
    /// `org.camaraproject.sim-swap-subscriptions.v0.swapped`, or a subscription lifecycle
    /// event (`…v0.subscription-started`, `-updated`, `-ended`), which is acknowledged only.
    #[serde(rename = "type")]
    event_type: String,
    /// `1.0`.
    specversion: String,
    /// When the swap happened (RFC 3339): the signal's `observed_at`.
    #[schema(value_type = String, format = DateTime)]
    time: Option<String>,
    /// `application/json` when present.
    datacontenttype: Option<String>,
    /// `{"subscriptionId": "…", "phoneNumber": "+E.164"}`; `phoneNumber` may be left out for
    /// a subscription registered with `verdict camara subscription add`.
    #[serde(default)]
    #[schema(value_type = Object)]
    data: Option<Value>,
}

/// A notification, read.
#[derive(Debug, PartialEq, Eq)]
pub enum Notification {
    /// A SIM swap.
    Swapped(Swapped),
    /// A subscription lifecycle event (`started`, `updated`, `ended`…): acknowledged only.
    Lifecycle { event_type: String },
}

/// A SIM swap notification.
#[derive(PartialEq, Eq)]
pub struct Swapped {
    /// The CloudEvent's `source` and `id`: its natural idempotency key.
    pub source: String,
    pub id: String,
    /// When the swap happened (the event's `time`).
    pub observed_at: OffsetDateTime,
    /// `data.phoneNumber`, when the carrier sent it.
    pub phone: Option<String>,
    /// `data.subscriptionId`.
    pub subscription_id: String,
}

impl std::fmt::Debug for Swapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swapped")
            .field("observed_at", &self.observed_at)
            .field("phone", &self.phone.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// The keyed digest a registered subscription id is stored and looked up by.
pub fn subscription_digest(keys: &Keyring, tenant_id: Uuid, subscription_id: &str) -> [u8; 32] {
    keys.digest(&[
        b"camara-subscription",
        tenant_id.as_bytes(),
        subscription_id.as_bytes(),
    ])
}

/// A SIM swap as the signal it is, under its natural idempotency key (`source`, `id`).
#[derive(Debug)]
pub struct SwapSignal {
    pub key: IdempotencyKey,
    pub signal: Signal,
}

/// Why a swap could not be made a signal.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// No `phoneNumber`, and the subscription is not registered.
    #[error("no `data.phoneNumber`, and the subscription is not registered")]
    MissingIdentifier,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a tenant's notification comes to: a swap is a signal about the number sent, or about
/// the phone registered for its subscription; a lifecycle event is acknowledged (logged and
/// counted) and decides nothing (`None`).
pub async fn signal(
    store: &(dyn FeedStore + Send + Sync),
    keys: &Keyring,
    tenant_id: Uuid,
    notification: Notification,
) -> Result<Option<SwapSignal>, SwapError> {
    let swap = match notification {
        Notification::Swapped(swap) => swap,
        Notification::Lifecycle { event_type } => {
            let kind = event_type.rsplit('.').next().unwrap_or_default();
            let kind = match kind {
                "subscription-started"
                | "subscription-updated"
                | "subscription-ended"
                | "subscription-ends" => kind,
                _ => "other",
            };
            tracing::info!(
                %tenant_id,
                lifecycle = kind,
                "CAMARA subscription lifecycle notification acknowledged"
            );
            metrics::counter!("verdict_feed_events_total", "feed" => "camara", "mapped" => "lifecycle")
                .increment(1);
            return Ok(None);
        }
    };
    let subject = match swap.phone {
        Some(phone) => Subject::Phone(phone),
        None => {
            let digest = subscription_digest(keys, tenant_id, &swap.subscription_id);
            let subject_hash = store
                .camara_subscription(tenant_id, &digest)
                .await?
                .and_then(|hash| <[u8; 32]>::try_from(hash).ok())
                .ok_or(SwapError::MissingIdentifier)?;
            Subject::Digested(subject_hash)
        }
    };
    let swapped_at = swap
        .observed_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    metrics::counter!("verdict_feed_events_total", "feed" => "camara", "mapped" => "true")
        .increment(1);
    Ok(Some(SwapSignal {
        key: natural_key(&[&swap.source, &swap.id]),
        signal: Signal {
            signal_type: SignalType::SimSwap,
            subject,
            observed_at: swap.observed_at,
            attributes: object(json!({ "event_type": SWAPPED, "swapped_at": swapped_at })),
            metadata: object(json!({ "cloudevent": { "source": swap.source, "id": swap.id } })),
        },
    }))
}

/// Parses a notification received at `now`; returns the generic JSON too, for the
/// fingerprint (RFC 8785, like a signal's).
pub fn parse(body: &[u8], now: OffsetDateTime) -> Result<(Notification, Value), CamaraError> {
    let value = strict_json::from_slice(body)
        .map_err(|_| CamaraError("the body is not valid JSON (or repeats a member name)"))?;
    let event: CloudEvent = serde_json::from_value(value.clone()).map_err(|_| {
        CamaraError(
            "the body must be a CloudEvents 1.0 event with string attributes `id`, `source`, \
             `type` and `specversion`",
        )
    })?;
    if event.specversion != "1.0" {
        return Err(CamaraError("`specversion` must be \"1.0\""));
    }
    let bounded = |s: &str| !s.is_empty() && s.chars().count() <= MAX_ATTRIBUTE_CHARS;
    if !bounded(&event.id) || !bounded(&event.source) {
        return Err(CamaraError(
            "`id` and `source` must be non-empty strings of at most 1024 characters",
        ));
    }
    if event
        .datacontenttype
        .as_deref()
        .is_some_and(|t| !t.eq_ignore_ascii_case("application/json"))
    {
        return Err(CamaraError("`datacontenttype` must be application/json"));
    }
    if event.event_type.starts_with(LIFECYCLE) {
        return Ok((
            Notification::Lifecycle {
                event_type: event.event_type,
            },
            value,
        ));
    }
    if event.event_type != SWAPPED {
        return Err(CamaraError(
            "`type` must be org.camaraproject.sim-swap-subscriptions.v0.swapped or a \
             subscription lifecycle event",
        ));
    }
    let observed_at = event
        .time
        .as_deref()
        .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
        .ok_or(CamaraError(
            "`time` must be an RFC 3339 date-time such as 2023-01-18T13:18:23.682Z",
        ))?;
    if observed_at > now + MAX_OBSERVED_AHEAD {
        return Err(CamaraError(
            "`time` must not be more than 5 minutes ahead of the server's clock",
        ));
    }
    let data: &Map<String, Value> =
        event
            .data
            .as_ref()
            .and_then(Value::as_object)
            .ok_or(CamaraError(
                "`data` must be an object with `subscriptionId`",
            ))?;
    let subscription_id = data
        .get("subscriptionId")
        .and_then(Value::as_str)
        .filter(|s| bounded(s))
        .ok_or(CamaraError(
            "`data.subscriptionId` must be a non-empty string of at most 1024 characters",
        ))?
        .to_owned();
    let phone = match data.get("phoneNumber") {
        None | Some(Value::Null) => None,
        Some(Value::String(phone)) => Some(validate_phone(phone.clone()).map_err(|_| {
            CamaraError("`data.phoneNumber` must be an E.164 number such as +123456789")
        })?),
        Some(_) => {
            return Err(CamaraError(
                "`data.phoneNumber` must be an E.164 number such as +123456789",
            ));
        }
    };
    Ok((
        Notification::Swapped(Swapped {
            source: event.source,
            id: event.id,
            observed_at,
            phone,
            subscription_id,
        }),
        value,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: OffsetDateTime = time::macros::datetime!(2026-11-30 12:00 UTC);

    /// The `SWAPPED` example notification of the published API definition
    /// (`code/API_definitions/sim-swap-subscriptions.yaml`, `components.examples.SWAPPED`).
    fn published_example() -> Value {
        json!({
            "id": "123655",
            "source": "supertelco.notificationSendServer12",
            "type": "org.camaraproject.sim-swap-subscriptions.v0.swapped",
            "specversion": "1.0",
            "datacontenttype": "application/json",
            "data": {
                "phoneNumber": "+123456788",
                "subscriptionId": "2ghy-55gg-7iup-yuo9"
            },
            "time": "2023-01-18T13:18:23.682Z"
        })
    }

    fn parse_value(v: &Value) -> Result<Notification, CamaraError> {
        parse(v.to_string().as_bytes(), NOW).map(|(n, _)| n)
    }

    #[test]
    fn the_published_example_is_a_swap_of_its_phone_at_its_time() {
        let Notification::Swapped(swap) = parse_value(&published_example()).unwrap() else {
            panic!("not a swap");
        };
        assert_eq!(swap.phone.as_deref(), Some("+123456788"));
        assert_eq!(swap.subscription_id, "2ghy-55gg-7iup-yuo9");
        assert_eq!(
            (swap.source.as_str(), swap.id.as_str()),
            ("supertelco.notificationSendServer12", "123655")
        );
        assert_eq!(
            swap.observed_at,
            time::macros::datetime!(2023-01-18 13:18:23.682 UTC)
        );
    }

    #[test]
    fn a_3_legged_swap_has_no_phone() {
        let mut event = published_example();
        event["data"].as_object_mut().unwrap().remove("phoneNumber");
        let Notification::Swapped(swap) = parse_value(&event).unwrap() else {
            panic!("not a swap");
        };
        assert_eq!(swap.phone, None);
    }

    #[test]
    fn lifecycle_events_are_recognised() {
        for kind in ["ended", "ends", "started", "updated"] {
            let mut event = published_example();
            event["type"] = json!(format!("{LIFECYCLE}{kind}"));
            assert!(matches!(
                parse_value(&event).unwrap(),
                Notification::Lifecycle { .. }
            ));
        }
    }

    #[test]
    fn malformed_notifications_are_refused_without_echoing_values() {
        let patches = [
            json!({"specversion": "0.3"}),
            json!({"id": ""}),
            json!({"type": "org.example.other"}),
            json!({"time": "yesterday"}),
            json!({"time": "2099-01-01T00:00:00Z"}),
            json!({"data": {"phoneNumber": "+123456788"}}),
            json!({"data": {"subscriptionId": "s", "phoneNumber": "0044770090"}}),
            json!({"datacontenttype": "text/plain"}),
        ];
        for patch in patches {
            let mut event = published_example();
            for (k, v) in patch.as_object().unwrap() {
                event[k] = v.clone();
            }
            let err = parse_value(&event).unwrap_err();
            assert!(!err.0.contains("0044770090"), "{patch}: {err}");
        }
        assert!(parse(b"{\"id\":\"1\",\"id\":\"2\"}", NOW).is_err());
    }
}
