//! Tenants: creation with fresh credentials, secret rotation, and the per-request lookups that
//! authenticate a signal.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::Serialize;
use uuid::Uuid;
use verdict_webhooks::Secret;

use crate::clock::now_ms;
use crate::delivery::destination::{CallbackUrl, UrlError};
use crate::secrets::{Keyring, SecretsError, api_key_hash};
use crate::store::{NewTenant, SealedSecret, SecretPurpose, Store, StoreError, TenantRecord};

/// Prefix of every API key, so leaked keys are recognisable by scanners.
const API_KEY_PREFIX: &str = "vk_";

/// Errors managing tenants.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    #[error("no tenant with id {0}")]
    NotFound(Uuid),
    #[error(transparent)]
    CallbackUrl(#[from] UrlError),
}

/// What `tenant create` prints; the secrets are shown this once and never again.
#[derive(Debug, Serialize)]
pub struct CreatedTenant {
    pub tenant_id: Uuid,
    pub name: String,
    pub api_key: String,
    pub signing_secret: String,
    pub webhook_secret: String,
    pub inbound_signature_required: bool,
    pub callback_url: Option<String>,
}

/// Options for a new tenant.
#[derive(Debug, Clone)]
pub struct TenantSpec {
    pub name: String,
    pub inbound_signature_required: bool,
    /// Checked by the destination guard when it was parsed.
    pub callback_url: Option<CallbackUrl>,
}

/// Associated data binding a sealed secret to its tenant and purpose.
fn seal_context(tenant_id: Uuid, purpose: SecretPurpose) -> Vec<u8> {
    format!("{tenant_id}/{}", purpose.as_str()).into_bytes()
}

fn seal(keys: &Keyring, tenant_id: Uuid, purpose: SecretPurpose, secret: &Secret) -> SealedSecret {
    SealedSecret {
        id: Uuid::now_v7(),
        purpose,
        sealed: keys.seal(secret.as_bytes(), &seal_context(tenant_id, purpose)),
        created_at: now_ms(),
        retired_at: None,
    }
}

fn generate_api_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{API_KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// Creates a tenant with a fresh API key, inbound signing secret and webhook secret.
pub async fn create(
    store: &dyn Store,
    keys: &Keyring,
    spec: TenantSpec,
) -> Result<CreatedTenant, TenantError> {
    let callback_url = spec.callback_url.as_ref().map(|u| u.as_str().to_owned());
    let id = Uuid::now_v7();
    let api_key = generate_api_key();
    let inbound = Secret::generate();
    let webhook = Secret::generate();
    let tenant = NewTenant {
        id,
        name: spec.name.clone(),
        api_key_hash: api_key_hash(&api_key).to_vec(),
        inbound_signature_required: spec.inbound_signature_required,
        callback_url: callback_url.clone(),
        created_at: now_ms(),
    };
    let sealed = [
        seal(keys, id, SecretPurpose::Inbound, &inbound),
        seal(keys, id, SecretPurpose::Webhook, &webhook),
    ];
    store.create_tenant(&tenant, &sealed).await?;
    Ok(CreatedTenant {
        tenant_id: id,
        name: spec.name,
        api_key,
        signing_secret: inbound.to_whsec(),
        webhook_secret: webhook.to_whsec(),
        inbound_signature_required: spec.inbound_signature_required,
        callback_url,
    })
}

/// Sets a tenant's callback URL (or removes it) and re-enables its endpoint.
pub async fn set_callback(
    store: &dyn Store,
    tenant_id: Uuid,
    url: Option<&CallbackUrl>,
) -> Result<(), TenantError> {
    if store
        .set_callback(tenant_id, url.map(CallbackUrl::as_str))
        .await?
    {
        Ok(())
    } else {
        Err(TenantError::NotFound(tenant_id))
    }
}

/// Replaces a tenant's secret of `purpose`; the old ones stay valid for `grace_ms`.
pub async fn rotate_secret(
    store: &dyn Store,
    keys: &Keyring,
    tenant_id: Uuid,
    purpose: SecretPurpose,
    grace_ms: i64,
) -> Result<Secret, TenantError> {
    store
        .tenant(tenant_id)
        .await?
        .ok_or(TenantError::NotFound(tenant_id))?;
    let secret = Secret::generate();
    let sealed = seal(keys, tenant_id, purpose, &secret);
    store
        .rotate_secret(tenant_id, &sealed, now_ms().saturating_add(grace_ms))
        .await?;
    Ok(secret)
}

/// A tenant's secrets of one purpose that are valid now, opened, newest first.
pub async fn live_secrets(
    store: &dyn Store,
    keys: &Keyring,
    tenant_id: Uuid,
    purpose: SecretPurpose,
) -> Result<Vec<Secret>, TenantError> {
    Ok(opened_secrets(store, keys, tenant_id, purpose)
        .await?
        .into_iter()
        .map(|(secret, _)| secret)
        .collect())
}

/// Live secrets, opened, each with when it retires.
async fn opened_secrets(
    store: &dyn Store,
    keys: &Keyring,
    tenant_id: Uuid,
    purpose: SecretPurpose,
) -> Result<Vec<(Secret, Option<i64>)>, TenantError> {
    let context = seal_context(tenant_id, purpose);
    store
        .live_secrets(tenant_id, purpose, now_ms())
        .await?
        .into_iter()
        .map(|s| {
            let secret = Secret::from_bytes(keys.open(&s.sealed, &context)?);
            Ok((secret, s.retired_at))
        })
        .collect()
}

/// How long a cached tenant or secret list may be used: a revoked key or a rotated secret
/// stops working within this time on every instance.
pub const CREDENTIALS_TTL: Duration = Duration::from_secs(5);

/// An opened secret and when it retires.
type Retiring = (Secret, Option<i64>);

/// Tenants by API key and their opened secrets, cached for at most [`CREDENTIALS_TTL`] so an
/// authenticated request costs no database round trip.
pub struct Credentials {
    store: Arc<dyn Store>,
    keys: Arc<Keyring>,
    tenants: moka::future::Cache<[u8; 32], TenantRecord>,
    secrets: moka::future::Cache<(Uuid, SecretPurpose), Arc<Vec<Retiring>>>,
}

impl Credentials {
    /// An empty cache in front of `store`.
    pub fn new(store: Arc<dyn Store>, keys: Arc<Keyring>) -> Self {
        Self {
            store,
            keys,
            tenants: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(CREDENTIALS_TTL)
                .build(),
            secrets: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(CREDENTIALS_TTL)
                .build(),
        }
    }

    /// The tenant an API key belongs to, if any. Unknown keys are not cached: a guesser
    /// must not be able to evict real tenants.
    pub async fn tenant(&self, api_key: &str) -> Result<Option<TenantRecord>, StoreError> {
        let hash = api_key_hash(api_key);
        if let Some(tenant) = self.tenants.get(&hash).await {
            return Ok(Some(tenant));
        }
        let found = self.store.tenant_by_api_key(&hash).await?;
        if let Some(tenant) = &found {
            self.tenants.insert(hash, tenant.clone()).await;
        }
        Ok(found)
    }

    /// The tenant of an API key if this instance has it cached; never a database read.
    pub async fn cached_tenant(&self, api_key: &str) -> Option<TenantRecord> {
        self.tenants.get(&api_key_hash(api_key)).await
    }

    /// The tenant's live secrets of `purpose` if cached; never a database read.
    pub async fn cached_secrets(
        &self,
        tenant_id: Uuid,
        purpose: SecretPurpose,
    ) -> Option<Vec<Secret>> {
        let cached = self.secrets.get(&(tenant_id, purpose)).await?;
        let now = now_ms();
        Some(
            cached
                .iter()
                .filter(|(_, retired_at)| retired_at.is_none_or(|at| at > now))
                .map(|(secret, _)| secret.clone())
                .collect(),
        )
    }

    /// The tenant's live secrets of `purpose`, opened, newest first. A secret retires at its
    /// own time even while cached; `fresh` reads past the cache (a rotation just made).
    pub async fn secrets(
        &self,
        tenant_id: Uuid,
        purpose: SecretPurpose,
        fresh: bool,
    ) -> Result<Vec<Secret>, TenantError> {
        let cached = match self.secrets.get(&(tenant_id, purpose)).await {
            Some(secrets) if !fresh => secrets,
            _ => {
                let opened =
                    Arc::new(opened_secrets(&*self.store, &self.keys, tenant_id, purpose).await?);
                self.secrets
                    .insert((tenant_id, purpose), opened.clone())
                    .await;
                opened
            }
        };
        let now = now_ms();
        Ok(cached
            .iter()
            .filter(|(_, retired_at)| retired_at.is_none_or(|at| at > now))
            .map(|(secret, _)| secret.clone())
            .collect())
    }
}
