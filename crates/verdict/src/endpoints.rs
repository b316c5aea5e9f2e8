//! Callback endpoints (SPEC §4): the tenant's receivers of decisions. This module manages them
//! (set, list, show, delete) for the API, the CLI and the console alike: it checks what a
//! tenant gives, makes and seals each endpoint's own signing secret, and hands a secret back
//! only once, in the answer that made it.
//!
//! The endpoint named `default` is the tenant's callback URL of old (`tenant create
//! --callback-url`, `tenant set-callback`): its id is the tenant's and it signs with the
//! tenant's webhook secrets, which `tenant rotate-secret` rotates.

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use verdict_webhooks::Secret;

use crate::clock::{now_ms, rfc3339};
use crate::destination::{CallbackUrl, DestinationPolicy, UrlError};
use crate::domain::{EndpointFilter, EndpointName, RepeatedFilterValue, SuspendedCallbacks};
use crate::secrets::{Keyring, SecretsError};
use crate::store::{EndpointRecord, PutEndpoint, StoreError};

pub use crate::store::ports::EndpointPort;

/// At most this many endpoints per tenant: each decision is a row and a send per matching
/// endpoint, read on every decision.
pub const MAX_ENDPOINTS_PER_TENANT: i64 = 16;
/// The longest endpoint URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// The largest body `PUT /v1/endpoints/{name}` takes: a URL, a filter of at most every
/// value of each dimension, and a flag.
pub const MAX_SPEC_BYTES: usize = 4096;

/// Why an endpoint could not be set, read or deleted.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("the URL is longer than {MAX_URL_BYTES} bytes")]
    UrlTooLong,
    #[error("the URL is refused: {0}")]
    Url(#[source] UrlError),
    #[error(transparent)]
    Filter(#[from] RepeatedFilterValue),
    #[error("the tenant has {MAX_ENDPOINTS_PER_TENANT} endpoints, the most it may have")]
    TooMany,
    #[error("no endpoint named {0}")]
    NotFound(EndpointName),
    #[error("no such tenant")]
    NoTenant,
    #[error("a stored secret could not be opened")]
    Secrets(#[source] SecretsError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl EndpointError {
    /// Whether the caller's input is at fault (a 4xx), rather than the service.
    pub fn is_input(&self) -> bool {
        matches!(
            self,
            Self::UrlTooLong | Self::Url(_) | Self::Filter(_) | Self::TooMany
        )
    }
}

/// What a tenant asks for: an endpoint of this name at this URL, taking what its filter
/// takes.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// Where callbacks are POSTed. The destination guard applies.
    #[schema(max_length = 2048)]
    pub url: String,
    /// Which decisions it receives; absent or empty lists take every value.
    #[serde(default)]
    pub filter: EndpointFilter,
    /// False stores its callbacks suspended, sending none, until it is enabled again.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// On enabling: leave the callbacks suspended meanwhile as they are (an operator
    /// redelivers the ones wanted) instead of sending each once now.
    #[serde(default)]
    pub leave_suspended: bool,
    /// For an endpoint with a secret of its own that exists: make a new one (the old one
    /// stops at once).
    #[serde(default)]
    pub rotate_secret: bool,
}

fn enabled() -> bool {
    true
}

/// An endpoint as shown: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EndpointView {
    pub id: Uuid,
    pub name: EndpointName,
    pub url: String,
    pub filter: EndpointFilter,
    pub enabled: bool,
    /// `tenant` (the tenant's webhook secrets, for `default`) or `own`.
    pub secret: SecretOwner,
    pub created_at: String,
    pub updated_at: String,
}

/// Whose secret signs an endpoint's callbacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecretOwner {
    /// The tenant's webhook secrets (the `default` endpoint).
    Tenant,
    /// A secret of the endpoint's own.
    Own,
}

impl From<&EndpointRecord> for EndpointView {
    fn from(e: &EndpointRecord) -> Self {
        Self {
            id: e.id,
            name: e.name.clone(),
            url: e.url.clone(),
            filter: e.filter.clone(),
            enabled: !e.disabled,
            secret: if e.sealed_secret.is_some() {
                SecretOwner::Own
            } else {
                SecretOwner::Tenant
            },
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

/// What setting an endpoint did: the endpoint, whether it is new, its signing secret when
/// this call made one (shown this once), and its suspended callbacks.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SetEndpoint {
    #[serde(flatten)]
    pub endpoint: EndpointView,
    #[serde(skip)]
    pub created: bool,
    /// The `whsec_` secret its callbacks are signed with; present only when this call made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_key: Option<String>,
    /// How many suspended callbacks this call made due (enabled, unless `leave_suspended`),
    /// or are left suspended.
    pub suspended_callbacks: u64,
}

/// Leaves the secret out.
impl std::fmt::Debug for SetEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetEndpoint")
            .field("endpoint", &self.endpoint)
            .field("created", &self.created)
            .field(
                "secret_key",
                &self.secret_key.as_ref().map(|_| "<redacted>"),
            )
            .finish_non_exhaustive()
    }
}

/// Associated data binding a sealed secret to its tenant and endpoint (by name, which a row
/// keeps for life: two concurrent creations of one name store one row, and either's secret
/// opens under it).
fn seal_context(tenant_id: Uuid, name: &EndpointName) -> Vec<u8> {
    format!("{tenant_id}/endpoint/{name}").into_bytes()
}

/// Creates or replaces the tenant's endpoint `name`. A new endpoint other than `default`
/// gets a signing secret of its own (returned this once); a replaced one keeps its id and
/// secret unless `rotate_secret` asks for a new one.
pub async fn set(
    store: &dyn EndpointPort,
    keys: &Keyring,
    tenant_id: Uuid,
    name: EndpointName,
    spec: EndpointSpec,
    policy: DestinationPolicy,
) -> Result<SetEndpoint, EndpointError> {
    let url = checked_url(&spec.url, policy)?;
    spec.filter.check()?;
    let existing = store.endpoint(tenant_id, &name).await?;
    let id = match (&existing, name.is_default()) {
        (Some(e), _) => e.id,
        (None, true) => tenant_id,
        (None, false) => Uuid::now_v7(),
    };
    let (sealed_secret, secret_key) = match (&existing, name.is_default()) {
        (_, true) => (None, None),
        (Some(e), false) if !spec.rotate_secret && e.sealed_secret.is_some() => {
            (e.sealed_secret.clone(), None)
        }
        _ => {
            let secret = Secret::generate();
            (
                Some(keys.seal(secret.as_bytes(), &seal_context(tenant_id, &name))),
                Some(secret.to_whsec()),
            )
        }
    };
    let now = now_ms();
    let record = EndpointRecord {
        id,
        tenant_id,
        name,
        url,
        sealed_secret,
        filter: spec.filter,
        disabled: !spec.enabled,
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        updated_at: now,
    };
    let suspended = if spec.leave_suspended {
        SuspendedCallbacks::Leave
    } else {
        SuspendedCallbacks::Resume
    };
    let (record, created, suspended) = match store
        .put_endpoint(&record, MAX_ENDPOINTS_PER_TENANT, suspended)
        .await?
    {
        PutEndpoint::Stored {
            record,
            created,
            suspended,
        } => (record, created, suspended),
        PutEndpoint::TooMany => return Err(EndpointError::TooMany),
        PutEndpoint::NoTenant => return Err(EndpointError::NoTenant),
    };
    tracing::info!(%tenant_id, endpoint = %record.name, new = created, "endpoint set");
    Ok(SetEndpoint {
        endpoint: EndpointView::from(&*record),
        created,
        secret_key,
        suspended_callbacks: suspended,
    })
}

/// Enables or disables one of the tenant's endpoints, changing nothing else: enabling makes
/// the callbacks suspended meanwhile due, each sent once. Returns how many that was (or how
/// many stay suspended).
pub async fn set_enabled(
    store: &dyn EndpointPort,
    tenant_id: Uuid,
    name: &EndpointName,
    enabled: bool,
) -> Result<u64, EndpointError> {
    match store
        .set_endpoint_enabled(
            tenant_id,
            name,
            enabled,
            SuspendedCallbacks::Resume,
            now_ms(),
        )
        .await?
    {
        Some(n) => {
            tracing::info!(%tenant_id, endpoint = %name, enabled, "endpoint enabled or disabled");
            Ok(n)
        }
        None => Err(EndpointError::NotFound(name.clone())),
    }
}

/// The tenant's endpoints, by name.
pub async fn list(
    store: &dyn EndpointPort,
    tenant_id: Uuid,
) -> Result<Vec<EndpointView>, EndpointError> {
    Ok(store
        .endpoints(tenant_id)
        .await?
        .iter()
        .map(EndpointView::from)
        .collect())
}

/// One of the tenant's endpoints.
pub async fn show(
    store: &dyn EndpointPort,
    tenant_id: Uuid,
    name: &EndpointName,
) -> Result<EndpointView, EndpointError> {
    match store.endpoint(tenant_id, name).await? {
        Some(e) => Ok(EndpointView::from(&e)),
        None => Err(EndpointError::NotFound(name.clone())),
    }
}

/// Deletes one of the tenant's endpoints. Its callbacks not yet sent fail when attempted,
/// saying there is no endpoint.
pub async fn delete(
    store: &dyn EndpointPort,
    tenant_id: Uuid,
    name: &EndpointName,
) -> Result<(), EndpointError> {
    if store.delete_endpoint(tenant_id, name).await? {
        tracing::info!(%tenant_id, endpoint = %name, "endpoint deleted");
        Ok(())
    } else {
        Err(EndpointError::NotFound(name.clone()))
    }
}

/// The endpoint's own signing secret in the clear, if it has one (else the tenant's webhook
/// secrets sign its callbacks).
pub fn own_secret(
    keys: &Keyring,
    tenant_id: Uuid,
    name: &EndpointName,
    sealed: &[u8],
) -> Result<Secret, EndpointError> {
    let bytes = keys
        .open(sealed, &seal_context(tenant_id, name))
        .map_err(EndpointError::Secrets)?;
    Ok(Secret::from_bytes(bytes))
}

/// The URL as stored, once the guard and the size bound allow it.
fn checked_url(text: &str, policy: DestinationPolicy) -> Result<String, EndpointError> {
    if text.len() > MAX_URL_BYTES {
        return Err(EndpointError::UrlTooLong);
    }
    let url = CallbackUrl::parse(text, policy).map_err(EndpointError::Url)?;
    Ok(url.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_bounded_and_guarded() {
        let open = DestinationPolicy {
            allow_private: true,
            allow_link_local: false,
        };
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(matches!(
            checked_url(&long, open),
            Err(EndpointError::UrlTooLong)
        ));
        assert!(matches!(
            checked_url("http://127.0.0.1:9/cb", DestinationPolicy::default()),
            Err(EndpointError::Url(_))
        ));
        assert_eq!(
            checked_url("http://127.0.0.1:9/cb?team=fraud", open).unwrap(),
            "http://127.0.0.1:9/cb?team=fraud"
        );
    }
}
