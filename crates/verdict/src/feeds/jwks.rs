//! A transmitter's signing keys: a JWKS (RFC 7517) parsed with `jsonwebtoken`, keeping only
//! public signature keys, each with the algorithms its key type allows, so a SET is verified
//! only with an algorithm that matches its key (never `none`, never HMAC with a public key).
//!
//! A JWKS given as a document is stored with the transmitter; one given as a URL is fetched
//! through the callbacks' destination guard (same client rules: no redirects, no proxies, every
//! resolved address checked), cached, and fetched again when a SET names an unknown `kid`: at
//! most once per refresh interval per URL, so a sender cannot make us fetch once per request.
//! A fetch that fails is remembered too: until its backoff (the refresh interval, doubling with
//! each failure in a row up to [`MAX_FAILURE_BACKOFF`]) passes, every SET gets the same error
//! without a fetch, whatever the SET rate.

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use uuid::Uuid;

use crate::destination::{DestinationPolicy, DestinationRefused, UrlError, check_url};

/// Largest JWKS document accepted, stored or fetched.
pub const MAX_JWKS_BYTES: usize = 64 * 1024;
/// Most keys a JWKS may hold.
pub const MAX_KEYS: usize = 20;
/// How long a fetched JWKS is used before it is fetched again.
pub const FETCHED_TTL: Duration = Duration::from_secs(60 * 60);
/// How long one fetch may take.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a URL whose fetches keep failing waits before it is fetched again.
pub const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(5 * 60);

/// Why a JWKS cannot be used.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum JwksError {
    #[error("the JWKS is larger than {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error("the JWKS is not a JSON object with a `keys` array")]
    NotJwks,
    #[error("the JWKS has more than {MAX_KEYS} keys")]
    TooManyKeys,
    #[error(
        "the JWKS has no public signature key verdict can use (RSA, EC P-256 or P-384, or \
         Ed25519; `oct` keys are never used)"
    )]
    NoUsableKey,
}

/// One public key and the algorithms it may verify.
pub struct SigningKey {
    pub kid: Option<String>,
    pub algorithms: Vec<Algorithm>,
    pub key: DecodingKey,
}

/// The usable keys of a JWKS.
pub struct Jwks {
    keys: Vec<SigningKey>,
}

/// What a lookup of a SET's key found.
pub enum Lookup<'a> {
    Found(&'a SigningKey),
    /// No key has this `kid`.
    UnknownKid,
    /// The key named (or the only candidate) does not verify the SET's `alg`.
    WrongAlgorithm,
    /// No `kid`, and not exactly one key for the `alg`.
    Ambiguous,
}

impl Jwks {
    /// Parses a JWKS document. Keys that cannot verify signatures (encryption keys, symmetric
    /// keys, unsupported curves, unreadable entries) are left out; a document with none left is
    /// refused.
    pub fn parse(text: &str) -> Result<Self, JwksError> {
        if text.len() > MAX_JWKS_BYTES {
            return Err(JwksError::TooLarge);
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|_| JwksError::NotJwks)?;
        let entries = value
            .get("keys")
            .and_then(serde_json::Value::as_array)
            .ok_or(JwksError::NotJwks)?;
        if entries.len() > MAX_KEYS {
            return Err(JwksError::TooManyKeys);
        }
        let keys: Vec<SigningKey> = entries
            .iter()
            .filter_map(|entry| serde_json::from_value::<Jwk>(entry.clone()).ok())
            .filter_map(|jwk| signing_key(&jwk))
            .collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey);
        }
        Ok(Self { keys })
    }

    /// How many usable keys it has.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Always false: a parsed JWKS has at least one key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key that must verify a SET with this `kid` and `alg`.
    pub fn find(&self, kid: Option<&str>, alg: Algorithm) -> Lookup<'_> {
        match kid {
            Some(kid) => {
                let mut named = self.keys.iter().filter(|k| k.kid.as_deref() == Some(kid));
                match named.clone().find(|k| k.algorithms.contains(&alg)) {
                    Some(key) => Lookup::Found(key),
                    None if named.next().is_some() => Lookup::WrongAlgorithm,
                    None => Lookup::UnknownKid,
                }
            }
            None => {
                let mut able = self.keys.iter().filter(|k| k.algorithms.contains(&alg));
                match (able.next(), able.next()) {
                    (Some(key), None) => Lookup::Found(key),
                    (None, _) => Lookup::WrongAlgorithm,
                    (Some(_), Some(_)) => Lookup::Ambiguous,
                }
            }
        }
    }
}

/// A JWK as a verifying key, if it is a public signature key of a type verdict uses.
fn signing_key(jwk: &Jwk) -> Option<SigningKey> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    if jwk
        .common
        .key_operations
        .as_ref()
        .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
    {
        return None;
    }
    let by_type: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => &[
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => &[],
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            &[Algorithm::EdDSA]
        }
        // A symmetric key in a transmitter's JWKS would let anyone who reads it sign SETs;
        // other key types and curves are not supported.
        _ => &[],
    };
    // A key that declares its `alg` verifies that one only.
    let algorithms: Vec<Algorithm> = by_type
        .iter()
        .copied()
        .filter(|&alg| {
            jwk.common
                .key_algorithm
                .is_none_or(|declared| declared == alg.into())
        })
        .collect();
    if algorithms.is_empty() {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(SigningKey {
        kid: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

/// Why a transmitter's keys could not be had.
#[derive(Clone, Debug, thiserror::Error)]
pub enum KeysError {
    #[error("the stored JWKS is unusable: {0}")]
    Stored(JwksError),
    #[error("the JWKS URL is refused: {0}")]
    Refused(UrlError),
    #[error("the JWKS could not be fetched")]
    Fetch(#[source] Arc<reqwest::Error>),
    #[error("the JWKS URL answered HTTP {0}")]
    Status(u16),
    #[error("the fetched JWKS is unusable: {0}")]
    Fetched(JwksError),
}

impl KeysError {
    /// Whether trying again later may work (the fetch failed), as opposed to a JWKS that is
    /// wrong until someone changes it.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Fetch(_) => true,
            Self::Status(status) => *status == 429 || *status >= 500,
            Self::Stored(_) | Self::Refused(_) | Self::Fetched(_) => false,
        }
    }
}

/// Where a transmitter's keys come from.
pub enum KeysFrom<'a> {
    /// A stored document, versioned by the transmitter's `updated_at`.
    Document {
        tenant_id: Uuid,
        version: i64,
        text: &'a str,
    },
    /// A URL to fetch.
    Url(&'a str),
}

/// Parsed and fetched JWKS documents, shared by every request of the instance.
pub struct KeyCache {
    client: reqwest::Client,
    policy: DestinationPolicy,
    /// Stored documents, parsed once per version.
    documents: moka::sync::Cache<(Uuid, i64), Arc<Jwks>>,
    /// Fetched documents by URL; a miss fetches once however many requests wait for it.
    fetched: moka::future::Cache<String, Arc<Jwks>>,
    /// URLs fetched within the refresh interval: an unknown `kid` fetches again only after it.
    recent: moka::sync::Cache<String, ()>,
    /// URLs whose last fetch failed, with when they may be fetched again.
    failed: moka::sync::Cache<String, Failed>,
    /// The first backoff after a failed fetch: the refresh interval.
    backoff: Duration,
}

/// A URL's failed fetches in a row, and its error until the backoff passes.
#[derive(Clone)]
struct Failed {
    error: KeysError,
    in_a_row: u32,
    until: std::time::Instant,
}

impl KeyCache {
    /// A cache fetching with `client` (the guarded one) under `policy`.
    pub fn new(client: reqwest::Client, policy: DestinationPolicy, refresh: Duration) -> Self {
        Self {
            client,
            policy,
            documents: moka::sync::Cache::new(10_000),
            fetched: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(FETCHED_TTL)
                .build(),
            recent: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(refresh.max(Duration::from_secs(1)))
                .build(),
            // Kept past the longest backoff, so a failure streak survives its own wait.
            failed: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(MAX_FAILURE_BACKOFF * 2)
                .build(),
            backoff: refresh.clamp(Duration::from_secs(1), MAX_FAILURE_BACKOFF),
        }
    }

    /// The keys as cached (fetched on a miss).
    pub async fn keys(&self, from: &KeysFrom<'_>) -> Result<Arc<Jwks>, KeysError> {
        match *from {
            KeysFrom::Document {
                tenant_id,
                version,
                text,
            } => {
                if let Some(jwks) = self.documents.get(&(tenant_id, version)) {
                    return Ok(jwks);
                }
                let jwks = Arc::new(Jwks::parse(text).map_err(KeysError::Stored)?);
                self.documents.insert((tenant_id, version), jwks.clone());
                Ok(jwks)
            }
            KeysFrom::Url(url) => {
                if let Some(jwks) = self.fetched.get(url).await {
                    return Ok(jwks);
                }
                let failed = self.failed.get(url);
                if let Some(failed) = failed
                    .as_ref()
                    .filter(|f| std::time::Instant::now() < f.until)
                {
                    return Err(failed.error.clone());
                }
                // Concurrent misses share this one fetch.
                let fetched = self
                    .fetched
                    .try_get_with(url.to_owned(), async {
                        self.recent.insert(url.to_owned(), ());
                        self.fetch(url).await.map(Arc::new)
                    })
                    .await
                    .map_err(|err| (*err).clone());
                match &fetched {
                    Ok(_) => self.failed.invalidate(url),
                    Err(error) => self.remember_failure(url, error, failed),
                }
                fetched
            }
        }
    }

    /// Holds `error` for `url` until its backoff passes, doubled for each failure in a row.
    fn remember_failure(&self, url: &str, error: &KeysError, before: Option<Failed>) {
        let in_a_row = before.map_or(1, |f| f.in_a_row.saturating_add(1));
        let backoff = self
            .backoff
            .saturating_mul(2u32.saturating_pow(in_a_row.saturating_sub(1).min(16)))
            .min(MAX_FAILURE_BACKOFF);
        tracing::warn!(error = ?error, in_a_row, backoff_secs = backoff.as_secs(),
            "fetching a SET transmitter's JWKS failed; not fetched again until the backoff passes");
        self.failed.insert(
            url.to_owned(),
            Failed {
                error: error.clone(),
                in_a_row,
                until: std::time::Instant::now() + backoff,
            },
        );
    }

    /// A fresh copy of a URL's keys after a SET named a `kid` the cached copy lacks; `None`
    /// when the URL was fetched within the refresh interval (the cached copy stands).
    pub async fn refresh(&self, url: &str) -> Result<Option<Arc<Jwks>>, KeysError> {
        let entry = self.recent.entry(url.to_owned()).or_insert(());
        if !entry.is_fresh() {
            return Ok(None);
        }
        let jwks = Arc::new(self.fetch(url).await?);
        self.fetched.insert(url.to_owned(), jwks.clone()).await;
        Ok(Some(jwks))
    }

    async fn fetch(&self, url: &str) -> Result<Jwks, KeysError> {
        let parsed = url::Url::parse(url).map_err(|_| KeysError::Refused(UrlError::NotHttp))?;
        check_url(&parsed, self.policy).map_err(KeysError::Refused)?;
        let mut response = self
            .client
            .get(parsed)
            .header(
                reqwest::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .timeout(FETCH_TIMEOUT)
            .send()
            .await
            .map_err(|e| match DestinationRefused::found_in(&e) {
                // A name that resolves only to addresses the guard refuses stays refused:
                // the transmitter's registration is wrong, not the network.
                Some(refused) => KeysError::Refused(UrlError::Refused(refused.0.clone())),
                None => KeysError::Fetch(Arc::new(e)),
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(KeysError::Status(status.as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| KeysError::Fetch(Arc::new(e)))?
        {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err(KeysError::Fetched(JwksError::TooLarge));
            }
            body.extend_from_slice(&chunk);
        }
        let text =
            std::str::from_utf8(&body).map_err(|_| KeysError::Fetched(JwksError::NotJwks))?;
        let jwks = Jwks::parse(text).map_err(KeysError::Fetched)?;
        tracing::info!(keys = jwks.len(), "fetched a SET transmitter's JWKS");
        Ok(jwks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A 2048-bit RSA modulus and a P-256 point, public values only.
    const RSA_N: &str = "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw";
    const EC_X: &str = "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU";
    const EC_Y: &str = "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0";

    fn rsa(extra: serde_json::Value) -> serde_json::Value {
        let mut key = json!({"kty": "RSA", "kid": "r1", "n": RSA_N, "e": "AQAB"});
        key.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        key
    }

    fn jwks(keys: Vec<serde_json::Value>) -> Jwks {
        Jwks::parse(&json!({ "keys": keys }).to_string()).unwrap()
    }

    #[test]
    fn each_key_verifies_only_the_algorithms_of_its_type() {
        let set = jwks(vec![
            rsa(json!({})),
            json!({"kty": "EC", "crv": "P-256", "kid": "e1", "x": EC_X, "y": EC_Y}),
        ]);
        assert!(matches!(
            set.find(Some("r1"), Algorithm::RS256),
            Lookup::Found(_)
        ));
        assert!(matches!(
            set.find(Some("r1"), Algorithm::PS256),
            Lookup::Found(_)
        ));
        assert!(matches!(
            set.find(Some("e1"), Algorithm::ES256),
            Lookup::Found(_)
        ));
        for (kid, alg) in [
            ("r1", Algorithm::HS256),
            ("r1", Algorithm::ES256),
            ("e1", Algorithm::RS256),
            ("e1", Algorithm::HS256),
            ("e1", Algorithm::ES384),
        ] {
            assert!(
                matches!(set.find(Some(kid), alg), Lookup::WrongAlgorithm),
                "{kid} {alg:?}"
            );
        }
        assert!(matches!(
            set.find(Some("nope"), Algorithm::RS256),
            Lookup::UnknownKid
        ));
        // Without a kid, the one key able to verify the alg.
        assert!(matches!(set.find(None, Algorithm::ES256), Lookup::Found(_)));
        assert!(matches!(
            set.find(None, Algorithm::HS256),
            Lookup::WrongAlgorithm
        ));
    }

    #[test]
    fn a_declared_alg_narrows_the_key_to_it() {
        let set = jwks(vec![rsa(json!({"alg": "PS256"}))]);
        assert!(matches!(
            set.find(Some("r1"), Algorithm::PS256),
            Lookup::Found(_)
        ));
        assert!(matches!(
            set.find(Some("r1"), Algorithm::RS256),
            Lookup::WrongAlgorithm
        ));
    }

    #[test]
    fn symmetric_and_encryption_keys_are_never_used() {
        let only_oct = json!({"keys": [{"kty": "oct", "kid": "h", "k": "c2VjcmV0"}]});
        assert_eq!(
            Jwks::parse(&only_oct.to_string()).err(),
            Some(JwksError::NoUsableKey)
        );
        let enc = json!({"keys": [rsa(json!({"use": "enc"}))]});
        assert_eq!(
            Jwks::parse(&enc.to_string()).err(),
            Some(JwksError::NoUsableKey)
        );
        let mixed = jwks(vec![
            json!({"kty": "oct", "kid": "r1", "k": "c2VjcmV0"}),
            rsa(json!({})),
        ]);
        assert_eq!(mixed.len(), 1);
        assert!(matches!(
            mixed.find(Some("r1"), Algorithm::HS256),
            Lookup::WrongAlgorithm
        ));
    }

    #[test]
    fn several_keys_without_a_kid_are_ambiguous() {
        let set = jwks(vec![rsa(json!({})), rsa(json!({"kid": "r2"}))]);
        assert!(matches!(
            set.find(None, Algorithm::RS256),
            Lookup::Ambiguous
        ));
    }

    #[test]
    fn malformed_oversized_and_crowded_documents_are_refused() {
        assert_eq!(Jwks::parse("[]").err(), Some(JwksError::NotJwks));
        assert_eq!(Jwks::parse("{\"keys\": 1}").err(), Some(JwksError::NotJwks));
        let crowd: Vec<_> = (0..=MAX_KEYS)
            .map(|i| rsa(json!({"kid": format!("k{i}")})))
            .collect();
        assert_eq!(
            Jwks::parse(&json!({ "keys": crowd }).to_string()).err(),
            Some(JwksError::TooManyKeys)
        );
        let big = format!("{{\"keys\":[],\"pad\":\"{}\"}}", "x".repeat(MAX_JWKS_BYTES));
        assert_eq!(Jwks::parse(&big).err(), Some(JwksError::TooLarge));
    }
}
