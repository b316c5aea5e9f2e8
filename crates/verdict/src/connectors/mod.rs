//! Connectors: the tenant's own systems its actions act on (SPEC §7). This module manages them
//! (set, list, show, delete) for the API and the CLI alike: it checks what a tenant gives,
//! seals the credential, and never hands a credential back except the signing secret it makes
//! for a new HTTP connector, once.

pub mod request;

use serde::{Deserialize, Serialize};
use uuid::Uuid;
use verdict_webhooks::Secret;

use crate::clock::{now_ms, rfc3339};
use crate::destination::{CallbackUrl, DestinationPolicy, UrlError};
use crate::domain::{ConnectorKind, ConnectorName, Guarantee, MatchAttribute};
use crate::secrets::{Keyring, SecretsError};
use crate::store::{ConnectorRecord, PutConnector, StoreError};

pub use crate::store::ports::ConnectorPort;

/// At most this many connectors per tenant.
pub const MAX_CONNECTORS_PER_TENANT: i64 = 32;
/// The longest connector URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// The longest SCIM bearer token, in bytes.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// Why a connector could not be set, read or deleted.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error("the URL is longer than {MAX_URL_BYTES} bytes")]
    UrlTooLong,
    #[error("the URL is refused: {0}")]
    Url(#[source] UrlError),
    #[error(
        "the URL may not carry a user, password, query or fragment: credentials go in the \
         connector's sealed secret or token, never in its URL"
    )]
    UrlCarriesSecrets,
    #[error("a SCIM connector needs a bearer token")]
    TokenMissing,
    #[error("the token is longer than {MAX_TOKEN_BYTES} bytes")]
    TokenTooLong,
    #[error("the token must be visible ASCII with no spaces")]
    TokenMalformed,
    #[error("an HTTP connector is signed with a secret verdict makes; it takes no token")]
    TokenNotForHttp,
    #[error("`match` applies to SCIM connectors only")]
    MatchNotForHttp,
    #[error("the tenant has {MAX_CONNECTORS_PER_TENANT} connectors, the most it may have")]
    TooMany,
    #[error("no connector named {0}")]
    NotFound(ConnectorName),
    #[error("a stored credential could not be opened")]
    Secrets(#[source] SecretsError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ConnectorError {
    /// Whether the caller's input is at fault (a 4xx), rather than the service.
    pub fn is_input(&self) -> bool {
        !matches!(self, Self::Secrets(_) | Self::Store(_) | Self::NotFound(_))
    }
}

/// What a tenant asks for: a connector of this name, kind and URL.
#[derive(Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorSpec {
    pub kind: ConnectorKind,
    /// An HTTP connector's endpoint, or a SCIM service provider's base URL (`/Users` is
    /// appended). The destination guard applies.
    #[schema(max_length = 2048)]
    pub url: String,
    /// A SCIM connector's bearer token: required when it is created, kept when omitted later.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub token: Option<String>,
    /// The SCIM attribute the subject's account is matched against (default `userName`).
    #[serde(default, rename = "match")]
    pub match_attribute: Option<MatchAttribute>,
    /// `exactly_once` (default): retried until it answers, for a connector that honours the
    /// `Idempotency-Key` or is naturally idempotent. `at_most_once`: never retried after an
    /// ambiguous outcome, which is then `unknown`.
    #[serde(default)]
    pub guarantee: Guarantee,
    /// For an HTTP connector that exists: make a new signing secret (the old one stops at once).
    #[serde(default)]
    pub rotate_secret: bool,
}

/// Leaves the token out.
impl std::fmt::Debug for ConnectorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorSpec")
            .field("kind", &self.kind)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("match", &self.match_attribute)
            .field("guarantee", &self.guarantee)
            .finish_non_exhaustive()
    }
}

/// A connector as shown: never its credential.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ConnectorView {
    pub name: ConnectorName,
    pub kind: ConnectorKind,
    pub url: String,
    /// SCIM only.
    #[serde(rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_attribute: Option<MatchAttribute>,
    pub guarantee: Guarantee,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&ConnectorRecord> for ConnectorView {
    fn from(c: &ConnectorRecord) -> Self {
        Self {
            name: c.name.clone(),
            kind: c.kind,
            url: c.url.clone(),
            match_attribute: (c.kind == ConnectorKind::Scim).then_some(c.match_attribute),
            guarantee: c.guarantee,
            created_at: rfc3339(c.created_at),
            updated_at: rfc3339(c.updated_at),
        }
    }
}

/// What setting a connector did: the connector, whether it is new, and an HTTP connector's
/// signing secret when this call made one (shown this once).
#[derive(Serialize, utoipa::ToSchema)]
pub struct SetConnector {
    #[serde(flatten)]
    pub connector: ConnectorView,
    #[serde(skip)]
    pub created: bool,
    /// The `whsec_` secret the connector's requests are signed with; present only when this
    /// call made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

/// Leaves the secret out.
impl std::fmt::Debug for SetConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetConnector")
            .field("connector", &self.connector)
            .field("created", &self.created)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Associated data binding a sealed credential to its tenant and connector.
fn seal_context(tenant_id: Uuid, name: &ConnectorName) -> Vec<u8> {
    format!("{tenant_id}/connector/{name}").into_bytes()
}

/// Creates or replaces the tenant's connector `name`. An HTTP connector keeps its signing
/// secret unless it is new, was SCIM before, or `rotate_secret` asks for a new one; a SCIM
/// connector keeps its token when none is given.
pub async fn set(
    store: &dyn ConnectorPort,
    keys: &Keyring,
    tenant_id: Uuid,
    name: ConnectorName,
    spec: ConnectorSpec,
    policy: DestinationPolicy,
) -> Result<SetConnector, ConnectorError> {
    let url = checked_url(&spec.url, policy)?;
    let existing = store.connector(tenant_id, &name).await?;
    let context = seal_context(tenant_id, &name);
    let (sealed_credential, secret) = match spec.kind {
        ConnectorKind::Http => {
            if spec.token.is_some() {
                return Err(ConnectorError::TokenNotForHttp);
            }
            if spec.match_attribute.is_some() {
                return Err(ConnectorError::MatchNotForHttp);
            }
            match existing.as_ref() {
                Some(c) if c.kind == ConnectorKind::Http && !spec.rotate_secret => {
                    (c.sealed_credential.clone(), None)
                }
                _ => {
                    let secret = Secret::generate();
                    (
                        keys.seal(secret.as_bytes(), &context),
                        Some(secret.to_whsec()),
                    )
                }
            }
        }
        ConnectorKind::Scim => match (spec.token.as_deref(), existing.as_ref()) {
            (Some(token), _) => (keys.seal(checked_token(token)?, &context), None),
            (None, Some(c)) if c.kind == ConnectorKind::Scim => (c.sealed_credential.clone(), None),
            (None, _) => return Err(ConnectorError::TokenMissing),
        },
    };
    let now = now_ms();
    let record = ConnectorRecord {
        tenant_id,
        name,
        kind: spec.kind,
        url,
        match_attribute: spec.match_attribute.unwrap_or_default(),
        guarantee: spec.guarantee,
        sealed_credential,
        created_at: existing.as_ref().map_or(now, |c| c.created_at),
        updated_at: now,
    };
    match store
        .put_connector(&record, MAX_CONNECTORS_PER_TENANT)
        .await?
    {
        PutConnector::Stored => {}
        PutConnector::TooMany => return Err(ConnectorError::TooMany),
    }
    tracing::info!(%tenant_id, connector = %record.name, kind = %record.kind,
        new = existing.is_none(), "connector set");
    Ok(SetConnector {
        connector: ConnectorView::from(&record),
        created: existing.is_none(),
        secret,
    })
}

/// The tenant's connectors, by name.
pub async fn list(
    store: &dyn ConnectorPort,
    tenant_id: Uuid,
) -> Result<Vec<ConnectorView>, ConnectorError> {
    Ok(store
        .connectors(tenant_id)
        .await?
        .iter()
        .map(ConnectorView::from)
        .collect())
}

/// One of the tenant's connectors.
pub async fn show(
    store: &dyn ConnectorPort,
    tenant_id: Uuid,
    name: &ConnectorName,
) -> Result<ConnectorView, ConnectorError> {
    match store.connector(tenant_id, name).await? {
        Some(c) => Ok(ConnectorView::from(&c)),
        None => Err(ConnectorError::NotFound(name.clone())),
    }
}

/// Deletes one of the tenant's connectors.
pub async fn delete(
    store: &dyn ConnectorPort,
    tenant_id: Uuid,
    name: &ConnectorName,
) -> Result<(), ConnectorError> {
    if store.delete_connector(tenant_id, name).await? {
        tracing::info!(%tenant_id, connector = %name, "connector deleted");
        Ok(())
    } else {
        Err(ConnectorError::NotFound(name.clone()))
    }
}

/// The connector's credential in the clear: an HTTP connector's signing secret, a SCIM
/// connector's bearer token.
pub fn credential(keys: &Keyring, connector: &ConnectorRecord) -> Result<Vec<u8>, ConnectorError> {
    keys.open(
        &connector.sealed_credential,
        &seal_context(connector.tenant_id, &connector.name),
    )
    .map_err(ConnectorError::Secrets)
}

/// The URL as stored, once the guard and the size bound allow it.
fn checked_url(text: &str, policy: DestinationPolicy) -> Result<String, ConnectorError> {
    if text.len() > MAX_URL_BYTES {
        return Err(ConnectorError::UrlTooLong);
    }
    let url = CallbackUrl::parse(text, policy).map_err(ConnectorError::Url)?;
    // Stored and shown in the clear, so it may hold nothing secret.
    let parsed = url::Url::parse(url.as_str()).map_err(|_| ConnectorError::UrlCarriesSecrets)?;
    if !parsed.username().is_empty()
        || parsed.password().is_some()
        || parsed.query().is_some()
        || parsed.fragment().is_some()
    {
        return Err(ConnectorError::UrlCarriesSecrets);
    }
    Ok(url.as_str().to_owned())
}

/// A bearer token, once its size and characters (RFC 6750's `b64token`, loosely) allow it.
fn checked_token(token: &str) -> Result<&[u8], ConnectorError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(ConnectorError::TokenTooLong);
    }
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConnectorError::TokenMalformed);
    }
    Ok(token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_bounded_and_visible_ascii() {
        assert!(checked_token("abc.DEF-123_~+/=").is_ok());
        assert!(matches!(
            checked_token(&"t".repeat(MAX_TOKEN_BYTES + 1)),
            Err(ConnectorError::TokenTooLong)
        ));
        for bad in ["", "a b", "a\nb", "tökén"] {
            assert!(
                matches!(checked_token(bad), Err(ConnectorError::TokenMalformed)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_url_is_bounded_and_guarded() {
        let open = DestinationPolicy {
            allow_private: true,
            allow_link_local: false,
        };
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL_BYTES));
        assert!(matches!(
            checked_url(&long, open),
            Err(ConnectorError::UrlTooLong)
        ));
        assert!(matches!(
            checked_url("http://127.0.0.1:9/scim", DestinationPolicy::default()),
            Err(ConnectorError::Url(_))
        ));
        assert_eq!(
            checked_url("http://127.0.0.1:9/scim", open).unwrap(),
            "http://127.0.0.1:9/scim"
        );
    }
}
