//! Tenants: creation with fresh credentials, API keys and their scopes, secret rotation, rate
//! limits, and the per-request lookups that authenticate a request.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::Serialize;
use uuid::Uuid;
use verdict_webhooks::Secret;

use crate::clock::now_ms;
use crate::destination::{CallbackUrl, UrlError};
use crate::domain::{EndpointName, Feed, SuspendedCallbacks};
use crate::secrets::{Keyring, SecretsError, api_key_hash};
use crate::store::{
    ApiKeyRecord, EndpointRecord, KeyGrant, NewApiKey, NewTenant, PutEndpoint, Scope, SealedSecret,
    SecretPurpose, StoreError,
};

pub use crate::store::ports::TenantPort;

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
    #[error("the callback URL is not an http(s) URL")]
    InvalidCallbackUrl,
    #[error("tenant {tenant_id} has no API key {key_id}")]
    KeyNotFound { tenant_id: Uuid, key_id: Uuid },
    #[error(transparent)]
    CallbackUrl(#[from] UrlError),
    #[error(
        "a key made for one feed must have the ingest scope, and the feed must be camara or set"
    )]
    FeedKey,
    #[error(
        "the tenant has {MAX_LIVE_KEYS_PER_TENANT} live API keys, the most it may have: revoke \
         one first"
    )]
    TooManyKeys,
    #[error(
        "the tenant has {} callback endpoints, the most it may have: delete one first",
        crate::endpoints::MAX_ENDPOINTS_PER_TENANT
    )]
    TooManyEndpoints,
}

/// Unrevoked API keys a tenant may hold: a real tenant needs a few per system and person, and
/// every key is a row and a credential that can leak.
pub const MAX_LIVE_KEYS_PER_TENANT: i64 = 100;

/// The most keys one page of a listing holds.
pub const MAX_KEYS_PAGE: i64 = 500;

/// A tenant as `tenant list` and `tenant show` print it: its settings, never its secrets.
#[derive(Debug, Serialize)]
pub struct TenantView {
    pub tenant_id: Uuid,
    pub name: String,
    pub created_at: String,
    pub callback_url: Option<String>,
    /// False once a 410 disabled the endpoint, until `set-callback` enables it again.
    pub callback_enabled: bool,
    pub inbound_signature_required: bool,
    /// Whether inbound signatures must cover the idempotency key (`v1` is not taken).
    pub inbound_signature_covers_key: bool,
    /// The tenant's own rate limit; absent when the server's setting applies.
    pub rate_limit_per_second: Option<i64>,
}

impl From<crate::store::TenantRecord> for TenantView {
    fn from(t: crate::store::TenantRecord) -> Self {
        Self {
            tenant_id: t.id,
            name: t.name,
            created_at: crate::clock::rfc3339(t.created_at),
            callback_url: t.callback_url,
            callback_enabled: !t.callback_disabled,
            inbound_signature_required: t.inbound_signature_required,
            inbound_signature_covers_key: t.inbound_signature_covers_key,
            rate_limit_per_second: t.rate_limit_per_second,
        }
    }
}

/// The most tenants one page of a listing holds.
const TENANTS_PAGE: i64 = 500;

/// Every tenant, oldest id first, read a page at a time.
pub async fn list(store: &dyn TenantPort) -> Result<Vec<TenantView>, TenantError> {
    list_in_pages(store, TENANTS_PAGE).await
}

/// [`list`], reading `page` tenants at a time.
async fn list_in_pages(store: &dyn TenantPort, page: i64) -> Result<Vec<TenantView>, TenantError> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let batch = store.tenants(after, page).await?;
        let full = batch.len() as i64 == page;
        after = batch.last().map(|t| t.id);
        all.extend(batch.into_iter().map(TenantView::from));
        if !full {
            return Ok(all);
        }
    }
}

/// One tenant's settings.
pub async fn show(store: &dyn TenantPort, tenant_id: Uuid) -> Result<TenantView, TenantError> {
    store
        .tenant(tenant_id)
        .await?
        .map(TenantView::from)
        .ok_or(TenantError::NotFound(tenant_id))
}

/// What `tenant create` prints; the secrets are shown this once and never again. Its `Debug`
/// leaves them out.
#[derive(Serialize)]
pub struct CreatedTenant {
    pub tenant_id: Uuid,
    pub name: String,
    pub api_key: String,
    pub signing_secret: String,
    pub webhook_secret: String,
    pub inbound_signature_required: bool,
    pub callback_url: Option<String>,
}

impl std::fmt::Debug for CreatedTenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedTenant")
            .field("tenant_id", &self.tenant_id)
            .field("name", &self.name)
            .field("api_key", &"<redacted>")
            .field("signing_secret", &"<redacted>")
            .field("webhook_secret", &"<redacted>")
            .field(
                "inbound_signature_required",
                &self.inbound_signature_required,
            )
            .field("callback_url", &self.callback_url.as_ref().map(|_| "<set>"))
            .finish()
    }
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

/// Whether a tenant's sealed secret opens under these keys.
pub fn opens_under(keys: &Keyring, tenant_id: Uuid, secret: &SealedSecret) -> bool {
    keys.open(&secret.sealed, &seal_context(tenant_id, secret.purpose))
        .is_ok()
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

/// A fresh key of `scope` (for `feed` alone, if given) for a tenant: the key to show once,
/// and the row holding its hash.
fn new_api_key(tenant_id: Uuid, scope: Scope, feed: Option<Feed>) -> (String, NewApiKey) {
    let api_key = generate_api_key();
    let row = NewApiKey {
        id: Uuid::now_v7(),
        tenant_id,
        key_hash: api_key_hash(&api_key),
        scope,
        feed,
        created_at: now_ms(),
    };
    (api_key, row)
}

/// Creates a tenant with a fresh admin API key, inbound signing secret and webhook secret.
pub async fn create(
    store: &dyn TenantPort,
    keys: &Keyring,
    spec: TenantSpec,
) -> Result<CreatedTenant, TenantError> {
    let callback_url = spec.callback_url.as_ref().map(|u| u.as_str().to_owned());
    let id = Uuid::now_v7();
    let (api_key, admin_key) = new_api_key(id, Scope::Admin, None);
    let inbound = Secret::generate();
    let webhook = Secret::generate();
    let tenant = NewTenant {
        id,
        name: spec.name.clone(),
        admin_key,
        inbound_signature_required: spec.inbound_signature_required,
        // Every tenant from now on: a signature must cover the key it is sent under.
        inbound_signature_covers_key: true,
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

/// What issuing a key prints or answers; the key is shown this once and never again. Its
/// `Debug` leaves it out.
#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuedKey {
    pub key_id: Uuid,
    pub api_key: String,
    pub scope: Scope,
    /// The one feed the key may post to (`camara` or `set`), if it is made for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub feed: Option<Feed>,
}

impl std::fmt::Debug for IssuedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedKey")
            .field("key_id", &self.key_id)
            .field("api_key", &"<redacted>")
            .field("scope", &self.scope)
            .field("feed", &self.feed)
            .finish()
    }
}

/// Sets whether a tenant's inbound signatures must cover the idempotency key (`v2` or
/// Standard Webhooks), or may be `v1`, which leaves it out.
pub async fn set_signature_covers_key(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    on: bool,
) -> Result<(), TenantError> {
    if store.set_signature_covers_key(tenant_id, on).await? {
        Ok(())
    } else {
        Err(TenantError::NotFound(tenant_id))
    }
}

/// Issues a new API key of `scope` to a tenant; with `feed`, an `ingest` key that may post
/// to that feed (`camara` or `set`) and nothing else.
pub async fn issue_key(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    scope: Scope,
    feed: Option<Feed>,
) -> Result<IssuedKey, TenantError> {
    if feed.is_some_and(|feed| scope != Scope::Ingest || feed == Feed::Signals) {
        return Err(TenantError::FeedKey);
    }
    store
        .tenant(tenant_id)
        .await?
        .ok_or(TenantError::NotFound(tenant_id))?;
    let (api_key, row) = new_api_key(tenant_id, scope, feed);
    if !store.insert_api_key(&row, MAX_LIVE_KEYS_PER_TENANT).await? {
        return Err(TenantError::TooManyKeys);
    }
    Ok(IssuedKey {
        key_id: row.id,
        api_key,
        scope,
        feed,
    })
}

/// A page of a tenant's keys (never the keys themselves), oldest first: up to `limit`
/// (brought within 1 to [`MAX_KEYS_PAGE`]) after the key `after`.
pub async fn list_keys(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<ApiKeyRecord>, TenantError> {
    store
        .tenant(tenant_id)
        .await?
        .ok_or(TenantError::NotFound(tenant_id))?;
    Ok(store
        .api_keys(tenant_id, after, limit.clamp(1, MAX_KEYS_PAGE))
        .await?)
}

/// Revokes one of a tenant's keys. Every instance refuses it within [`CREDENTIALS_TTL`].
pub async fn revoke_key(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    key_id: Uuid,
) -> Result<(), TenantError> {
    if store.revoke_api_key(tenant_id, key_id, now_ms()).await? {
        Ok(())
    } else {
        Err(TenantError::KeyNotFound { tenant_id, key_id })
    }
}

/// Sets the tenant's own rate limit in requests per second, or removes it (`None`) so the
/// server's setting applies. Every instance applies it within [`CREDENTIALS_TTL`].
pub async fn set_rate_limit(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    per_second: Option<std::num::NonZeroU32>,
) -> Result<(), TenantError> {
    let per_second = per_second.map(|n| i64::from(n.get()));
    if store.set_rate_limit(tenant_id, per_second).await? {
        Ok(())
    } else {
        Err(TenantError::NotFound(tenant_id))
    }
}

/// A callback URL must be an absolute http(s) URL.
pub fn validate_callback_url(url: &str) -> Result<(), TenantError> {
    match reqwest::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => Ok(()),
        _ => Err(TenantError::InvalidCallbackUrl),
    }
}

/// Sets a tenant's callback URL (its `default` endpoint, keeping that endpoint's filter) and
/// enables it, resuming or leaving the callbacks suspended while it was disabled; returns how
/// many were resumed, or are left. `None` removes the endpoint (its unsent callbacks then
/// fail, saying there is no endpoint) and returns 0.
pub async fn set_callback(
    store: &dyn TenantPort,
    tenant_id: Uuid,
    url: Option<&CallbackUrl>,
    suspended: SuspendedCallbacks,
) -> Result<u64, TenantError> {
    let name = EndpointName::default_endpoint();
    let Some(url) = url else {
        if store.tenant(tenant_id).await?.is_none() {
            return Err(TenantError::NotFound(tenant_id));
        }
        store.delete_endpoint(tenant_id, &name).await?;
        return Ok(0);
    };
    let existing = store.endpoint(tenant_id, &name).await?;
    let now = now_ms();
    let record = EndpointRecord {
        id: tenant_id,
        tenant_id,
        url: url.as_str().to_owned(),
        sealed_secret: None,
        filter: existing
            .as_ref()
            .map(|e| e.filter.clone())
            .unwrap_or_default(),
        disabled: false,
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        updated_at: now,
        name,
    };
    match store
        .put_endpoint(
            &record,
            crate::endpoints::MAX_ENDPOINTS_PER_TENANT,
            suspended,
        )
        .await?
    {
        PutEndpoint::Stored { suspended, .. } => Ok(suspended),
        PutEndpoint::TooMany => Err(TenantError::TooManyEndpoints),
        PutEndpoint::NoTenant => Err(TenantError::NotFound(tenant_id)),
    }
}

/// Replaces a tenant's secret of `purpose`; the old ones stay valid for `grace_ms`.
pub async fn rotate_secret(
    store: &dyn TenantPort,
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
    store: &dyn TenantPort,
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
    store: &dyn TenantPort,
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

/// How long a cached key or secret list may be used: a revoked key or a rotated secret
/// stops working within this time on every instance. A second and a half short of the 5 s the
/// README promises: an entry cached a moment before a revocation lives its whole lifetime
/// after it, and `scripts/scale-out` once measured a rotated-out secret refused 5.4 s after
/// the rotation with a 4.5 s lifetime under load (a 5 s one ended at 5.00 to 5.05 s).
pub const CREDENTIALS_TTL: Duration = Duration::from_millis(3500);

/// A key's `last_used_at` is written at most once per this interval per instance, off the
/// request's path.
pub const LAST_USED_PRECISION: Duration = Duration::from_secs(60);

/// An opened secret and when it retires.
type Retiring = (Secret, Option<i64>);

/// What API keys grant (tenant, scope, key id) and tenants' opened secrets, cached for at most
/// [`CREDENTIALS_TTL`] so an authenticated request costs no database round trip.
pub struct Credentials {
    store: Arc<dyn TenantPort>,
    keys: Arc<Keyring>,
    grants: moka::future::Cache<[u8; 32], KeyGrant>,
    secrets: moka::future::Cache<(Uuid, SecretPurpose), Arc<Vec<Retiring>>>,
    /// Keys whose use this instance recorded within [`LAST_USED_PRECISION`].
    used: moka::future::Cache<Uuid, ()>,
}

impl Credentials {
    /// An empty cache in front of `store`.
    pub fn new(store: Arc<dyn TenantPort>, keys: Arc<Keyring>) -> Self {
        Self {
            store,
            keys,
            grants: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(CREDENTIALS_TTL)
                .support_invalidation_closures()
                .build(),
            secrets: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(CREDENTIALS_TTL)
                .build(),
            used: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(LAST_USED_PRECISION)
                .build(),
        }
    }

    /// What an API key grants, if it is a live key. Unknown and revoked keys are not cached: a
    /// guesser must not be able to evict real tenants.
    pub async fn grant(&self, api_key: &str) -> Result<Option<KeyGrant>, StoreError> {
        let hash = api_key_hash(api_key);
        let grant = match self.grants.get(&hash).await {
            Some(grant) => grant,
            None => match self.store.grant_by_key_hash(&hash).await? {
                Some(grant) => {
                    self.grants.insert(hash, grant.clone()).await;
                    grant
                }
                None => return Ok(None),
            },
        };
        self.note_use(grant.key_id).await;
        Ok(Some(grant))
    }

    /// What an API key grants if this instance has it cached; never a database read.
    pub async fn cached_grant(&self, api_key: &str) -> Option<KeyGrant> {
        let grant = self.grants.get(&api_key_hash(api_key)).await?;
        self.note_use(grant.key_id).await;
        Some(grant)
    }

    /// Drops a key from this instance's cache at once (it was just revoked here; other
    /// instances drop it within [`CREDENTIALS_TTL`]).
    pub fn forget_key(&self, key_id: Uuid) {
        if let Err(err) = self
            .grants
            .invalidate_entries_if(move |_, grant| grant.key_id == key_id)
        {
            tracing::warn!(error = %err, "could not drop a revoked key from the cache");
        }
    }

    /// Records a key's use in the background, at most once per [`LAST_USED_PRECISION`]: the
    /// request never waits for, or fails by, this write.
    async fn note_use(&self, key_id: Uuid) {
        // A read first: the entry API takes the cache's write path on every request.
        if self.used.contains_key(&key_id)
            || !self.used.entry(key_id).or_insert(()).await.is_fresh()
        {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(err) = store.touch_api_key(key_id, now_ms()).await {
                tracing::debug!(error = %err, %key_id, "recording an API key's last use failed");
            }
        });
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Seven tenants read two at a time (the last page short) and three at a time (the last
    /// page empty), from a real SQLite store: each once, in the order they were created.
    #[tokio::test]
    async fn tenants_listed_page_by_page_are_each_listed_once_in_order() {
        let dir = std::env::temp_dir().join(format!("verdict-tenants-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let url = format!("sqlite://{}", dir.join("v.db").display());
        let store = crate::store::connect(&url).await.expect("opens");
        let keys =
            crate::secrets::MasterKey::from_base64(&crate::secrets::MasterKey::generate_base64())
                .expect("a fresh key")
                .keyring();
        let mut created = Vec::new();
        for n in 0..7 {
            let spec = TenantSpec {
                name: format!("t{n}"),
                inbound_signature_required: true,
                callback_url: None,
            };
            created.push(
                create(&*store, &keys, spec)
                    .await
                    .expect("created")
                    .tenant_id,
            );
        }
        for page in [2, 3, 500] {
            let listed: Vec<Uuid> = list_in_pages(&*store, page)
                .await
                .expect("listed")
                .into_iter()
                .map(|t| t.tenant_id)
                .collect();
            assert_eq!(listed, created, "pages of {page}");
        }
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn created_tenant_debug_prints_no_secret() {
        let created = CreatedTenant {
            tenant_id: Uuid::now_v7(),
            name: "acme".into(),
            api_key: generate_api_key(),
            signing_secret: Secret::generate().to_whsec(),
            webhook_secret: Secret::generate().to_whsec(),
            inbound_signature_required: true,
            callback_url: Some("https://hooks.example/cb?token=t0ken".into()),
        };
        let printed = format!("{created:?}");
        for secret in [
            &created.api_key,
            &created.signing_secret,
            &created.webhook_secret,
        ] {
            assert!(!printed.contains(secret.as_str()), "{printed}");
        }
        assert!(
            !printed.contains("t0ken") && printed.contains("acme"),
            "{printed}"
        );
    }
    #[test]
    fn issued_key_debug_prints_no_key() {
        let issued = IssuedKey {
            key_id: Uuid::now_v7(),
            api_key: generate_api_key(),
            scope: Scope::Ingest,
            feed: None,
        };
        let printed = format!("{issued:?}");
        assert!(!printed.contains(&issued.api_key), "{printed}");
        assert!(printed.contains(&issued.key_id.to_string()) && printed.contains("Ingest"));
    }
}
