//! Standard signal feeds: the formats the identity world already speaks, each with its natural
//! idempotency key, landing in the same claim, decision, actions and callback pipeline as
//! `POST /v1/signals`.
//!
//! - [`set`]: Security Event Tokens (RFC 8417) pushed per RFC 8935 by an OpenID Shared Signals
//!   transmitter (RISC, CAEP); key (`iss`, `jti`).
//! - [`jwks`]: the transmitter's signing keys, from a stored document or fetched (through the
//!   callbacks' destination guard) and cached.
//! - [`camara`]: CAMARA SIM Swap notifications (CloudEvents 1.0); key (`source`, `id`).

pub mod camara;
pub mod jwks;
pub mod set;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::clock::now_ms;
use crate::destination::{DestinationPolicy, UrlError, check_url};
use crate::idempotency::IdempotencyKey;
use crate::secrets::Keyring;
use crate::signal::{Subject, subject_digest, validate_phone};
use crate::store::{StoreError, TransmitterRecord};

pub use crate::store::ports::FeedPort;

/// The idempotency key of a feed event made of its natural key's parts (each length-prefixed,
/// so no two different tuples make the same key). Like every key, it is stored only as a keyed
/// digest.
pub fn natural_key(parts: &[&str]) -> IdempotencyKey {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let hex = crate::secrets::hex(&hash.finalize());
    IdempotencyKey::parse(hex.as_bytes()).expect("64 hex digits are a valid idempotency key")
}

/// A JSON object's members (none for any other value).
fn object(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match value {
        serde_json::Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// Where a transmitter's signing keys come from.
pub enum TransmitterKeys {
    /// A JWKS document, stored with the transmitter.
    Document(String),
    /// A URL the JWKS is fetched from.
    Url(String),
}

/// Why a feed registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("no tenant with id {0}")]
    NoTenant(Uuid),
    #[error("the {0} must be 1 to 256 characters with no control characters")]
    BadText(&'static str),
    #[error("the JWKS cannot be used: {0}")]
    Jwks(#[from] jwks::JwksError),
    #[error("the JWKS URL must be an absolute http(s) URL")]
    JwksUrlNotHttp,
    #[error("the JWKS URL is refused: {0}")]
    JwksUrlRefused(crate::destination::Refusal),
    #[error("the phone number must be E.164: `+` then 2 to 15 digits, not starting with 0")]
    BadPhone,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a transmitter registration stored.
#[derive(Debug, serde::Serialize)]
pub struct TransmitterSet {
    pub tenant_id: Uuid,
    pub issuer: String,
    pub audience: String,
    /// Usable keys in the stored document (none counted for a URL, fetched when needed).
    pub keys: Option<usize>,
    pub jwks_url: Option<String>,
}

fn checked_text(what: &'static str, text: String) -> Result<String, RegistrationError> {
    let ok = !text.is_empty() && text.chars().count() <= 256 && !text.chars().any(char::is_control);
    ok.then_some(text).ok_or(RegistrationError::BadText(what))
}

/// Sets (or replaces) the tenant's SET transmitter, after checking its keys: a document must
/// hold a usable key, a URL must pass the destination guard under `policy`.
pub async fn set_transmitter(
    store: &dyn FeedPort,
    tenant_id: Uuid,
    issuer: String,
    audience: String,
    keys: TransmitterKeys,
    policy: DestinationPolicy,
) -> Result<TransmitterSet, RegistrationError> {
    store
        .tenant(tenant_id)
        .await?
        .ok_or(RegistrationError::NoTenant(tenant_id))?;
    let issuer = checked_text("issuer", issuer)?;
    let audience = checked_text("audience", audience)?;
    let (jwks, jwks_url, count) = match keys {
        TransmitterKeys::Document(text) => {
            let count = jwks::Jwks::parse(&text)?.len();
            (Some(text), None, Some(count))
        }
        TransmitterKeys::Url(text) => {
            let url = url::Url::parse(&text).map_err(|_| RegistrationError::JwksUrlNotHttp)?;
            check_url(&url, policy).map_err(|err| match err {
                UrlError::NotHttp => RegistrationError::JwksUrlNotHttp,
                UrlError::Refused(refusal) => RegistrationError::JwksUrlRefused(refusal),
            })?;
            (None, Some(url.to_string()), None)
        }
    };
    store
        .put_transmitter(&TransmitterRecord {
            tenant_id,
            issuer: issuer.clone(),
            audience: audience.clone(),
            jwks,
            jwks_url: jwks_url.clone(),
            updated_at: now_ms(),
        })
        .await?;
    Ok(TransmitterSet {
        tenant_id,
        issuer,
        audience,
        keys: count,
        jwks_url,
    })
}

/// Registers the phone a CAMARA subscription is about, for notifications that leave it out.
/// Both are stored only as keyed digests.
pub async fn add_camara_subscription(
    store: &dyn FeedPort,
    keys: &Keyring,
    tenant_id: Uuid,
    subscription_id: String,
    phone: String,
) -> Result<(), RegistrationError> {
    store
        .tenant(tenant_id)
        .await?
        .ok_or(RegistrationError::NoTenant(tenant_id))?;
    let subscription_id = checked_text("subscription id", subscription_id)?;
    let phone = validate_phone(phone).map_err(|_| RegistrationError::BadPhone)?;
    let subject = subject_digest(keys, tenant_id, &Subject::Phone(phone));
    let digest = camara::subscription_digest(keys, tenant_id, &subscription_id);
    store
        .put_camara_subscription(tenant_id, &digest, &subject, now_ms())
        .await?;
    Ok(())
}

/// Forgets a registered CAMARA subscription; false if it was not registered.
pub async fn remove_camara_subscription(
    store: &dyn FeedPort,
    keys: &Keyring,
    tenant_id: Uuid,
    subscription_id: &str,
) -> Result<bool, RegistrationError> {
    let digest = camara::subscription_digest(keys, tenant_id, subscription_id);
    Ok(store.remove_camara_subscription(tenant_id, &digest).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_keys_do_not_collide_when_a_boundary_moves() {
        assert_ne!(
            natural_key(&["ab", "c"]).as_bytes(),
            natural_key(&["a", "bc"]).as_bytes()
        );
        assert_eq!(
            natural_key(&["iss", "jti"]).as_bytes(),
            natural_key(&["iss", "jti"]).as_bytes()
        );
    }
}
