//! Security Event Tokens (RFC 8417) pushed per RFC 8935 by a tenant's OpenID Shared Signals
//! transmitter: verified with `jsonwebtoken` against the transmitter's keys, then read as one
//! event about one subject (RFC 9493 subject identifiers).
//!
//! Verification, in order: the JWS header (`alg`: an asymmetric algorithm, never `none` or
//! HMAC; `typ`, when present, `secevent+jwt`), the key (by `kid`, only with an algorithm its key
//! type allows; an unknown `kid` refreshes a fetched JWKS, rate limited), the signature, `iss`
//! and `aud` (the transmitter's), `exp`/`nbf` when present, `iat` within the window, then the
//! claims a SET must have. Every refusal is an RFC 8935 error code with a fixed description
//! that never repeats what the token held.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::{Map, Value, json};
use time::OffsetDateTime;
use uuid::Uuid;

use super::jwks::{KeyCache, KeysError, KeysFrom, Lookup};
use super::{natural_key, object};
use crate::idempotency::IdempotencyKey;
use crate::signal::{MAX_OBSERVED_AHEAD, Subject, validate_account, validate_phone};
use crate::store::{FeedStore, StoreError, TransmitterRecord};

/// Longest `iss`, `jti`, event type URI or subject identifier part accepted, in characters.
const MAX_CLAIM_CHARS: usize = 256;

/// How far `exp` and `nbf` may be off, as for any JWT.
const LEEWAY_SECS: u64 = 60;

/// How old and how far ahead a SET's `iat` may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetWindow {
    /// A SET issued longer ago than this is refused (a replay of an old token).
    pub max_age: Duration,
    /// A SET issued further ahead of our clock than this is refused.
    pub max_ahead: Duration,
}

impl Default for SetWindow {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(300),
            max_ahead: Duration::from_secs(60),
        }
    }
}

/// Why a SET is refused: the RFC 8935 error code and a description that names no value sent.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// `invalid_request`: not a SET, or not one we can read.
    #[error("{0}")]
    InvalidRequest(&'static str),
    /// `invalid_key`: not signed with an acceptable key and algorithm.
    #[error("{0}")]
    InvalidKey(&'static str),
    /// `invalid_issuer`: not from this tenant's transmitter.
    #[error("{0}")]
    InvalidIssuer(&'static str),
    /// `invalid_audience`: not meant for this receiver.
    #[error("the SET's `aud` does not name this receiver's audience")]
    InvalidAudience,
    /// The transmitter's keys could not be fetched now: worth a retry.
    #[error("the transmitter's keys could not be fetched; retry later")]
    KeysUnavailable(#[source] KeysError),
    #[error("storage failed")]
    Store(#[from] StoreError),
}

impl SetError {
    /// The RFC 8935 `err` code; `None` for failures that are not the request's fault.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::InvalidRequest(_) => Some("invalid_request"),
            Self::InvalidKey(_) => Some("invalid_key"),
            Self::InvalidIssuer(_) => Some("invalid_issuer"),
            Self::InvalidAudience => Some("invalid_audience"),
            Self::KeysUnavailable(_) | Self::Store(_) => None,
        }
    }
}

/// A verified SET, read as one event about one subject.
#[derive(Debug)]
pub struct VerifiedSet {
    pub issuer: String,
    pub jti: String,
    /// The event type URI (the one member of `events`).
    pub event_type: String,
    pub subject: Subject,
    /// `toe`, or the event's `event_timestamp` (CAEP), or `iat`.
    pub observed_at: OffsetDateTime,
}

impl VerifiedSet {
    /// Its natural idempotency key: (`iss`, `jti`).
    pub fn key(&self) -> IdempotencyKey {
        natural_key(&[&self.issuer, &self.jti])
    }

    /// Facts about it that name no identifier: its event type.
    pub fn attributes(&self) -> Map<String, Value> {
        object(json!({ "event_type": self.event_type }))
    }

    /// Where it came from: its issuer and token id.
    pub fn metadata(&self) -> Map<String, Value> {
        object(json!({ "set": { "iss": self.issuer, "jti": self.jti } }))
    }
}

/// Verifies SETs for every tenant: its transmitter (cached for at most 5 s, so a change made
/// with the CLI reaches every instance within that) and its keys.
pub struct SetReceiver {
    store: Arc<dyn FeedStore + Send + Sync>,
    window: SetWindow,
    keys: KeyCache,
    transmitters: moka::future::Cache<Uuid, Option<Arc<TransmitterRecord>>>,
}

/// How long a transmitter's configuration is cached.
const TRANSMITTER_TTL: Duration = Duration::from_secs(5);

impl SetReceiver {
    /// A receiver reading transmitters from `store` and keys through `keys`.
    pub fn new(store: Arc<dyn FeedStore + Send + Sync>, window: SetWindow, keys: KeyCache) -> Self {
        Self {
            store,
            window,
            keys,
            transmitters: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(TRANSMITTER_TTL)
                .build(),
        }
    }

    /// Verifies `token` (a compact JWS) for the tenant at `now`.
    pub async fn verify(
        &self,
        tenant_id: Uuid,
        token: &str,
        now: OffsetDateTime,
    ) -> Result<VerifiedSet, SetError> {
        let alg = header_algorithm(token)?;
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| SetError::InvalidRequest("the SET's JWS header is malformed"))?;
        if header.typ.as_deref().is_some_and(|typ| !is_secevent(typ)) {
            return Err(SetError::InvalidRequest(
                "the SET's `typ` header is not `secevent+jwt`",
            ));
        }
        let transmitter = self
            .transmitter(tenant_id)
            .await?
            .ok_or(SetError::InvalidIssuer(
                "this tenant has no SET transmitter; set one with `verdict tenant set-transmitter`",
            ))?;
        let from = match (&transmitter.jwks, &transmitter.jwks_url) {
            (Some(text), _) => KeysFrom::Document {
                tenant_id,
                version: transmitter.updated_at,
                text,
            },
            (None, Some(url)) => KeysFrom::Url(url),
            (None, None) => {
                return Err(StoreError::Corrupt("a transmitter has no keys".into()).into());
            }
        };
        let mut jwks = self.keys.keys(&from).await.map_err(keys_error)?;
        if let (Lookup::UnknownKid, KeysFrom::Url(url)) =
            (jwks.find(header.kid.as_deref(), alg), &from)
            && let Some(fresh) = self.keys.refresh(url).await.map_err(keys_error)?
        {
            jwks = fresh;
        }
        let key = match jwks.find(header.kid.as_deref(), alg) {
            Lookup::Found(key) => key,
            Lookup::UnknownKid => {
                return Err(SetError::InvalidKey(
                    "no key of the transmitter has the SET's `kid`",
                ));
            }
            Lookup::WrongAlgorithm => {
                return Err(SetError::InvalidKey(
                    "the SET's `alg` does not match the type of the transmitter's key",
                ));
            }
            Lookup::Ambiguous => {
                return Err(SetError::InvalidKey(
                    "the SET has no `kid` and the transmitter has several keys for its `alg`",
                ));
            }
        };
        let mut validation = Validation::new(alg);
        validation.set_issuer(&[&transmitter.issuer]);
        validation.set_audience(&[&transmitter.audience]);
        validation.set_required_spec_claims(&["iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECS;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation)
            .map_err(|err| decode_error(err.kind()))?
            .claims;
        read_claims(&claims, now, self.window)
    }

    async fn transmitter(
        &self,
        tenant_id: Uuid,
    ) -> Result<Option<Arc<TransmitterRecord>>, StoreError> {
        let store = self.store.clone();
        self.transmitters
            .try_get_with(tenant_id, async move {
                Ok::<_, StoreError>(store.transmitter(tenant_id).await?.map(Arc::new))
            })
            .await
            .map_err(|err| Arc::try_unwrap(err).unwrap_or_else(StoreError::Batch))
    }
}

/// The SET's `alg`, refused before any key is looked at when it is `none`, HMAC or unknown.
fn header_algorithm(token: &str) -> Result<Algorithm, SetError> {
    let malformed =
        SetError::InvalidRequest("the body is not a compact JWS (three base64url parts)");
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed);
    };
    let header: Map<String, Value> = URL_SAFE_NO_PAD
        .decode(header)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or(malformed)?;
    let alg = header
        .get("alg")
        .and_then(Value::as_str)
        .ok_or(SetError::InvalidRequest(
            "the SET's JWS header has no `alg`",
        ))?;
    if alg.eq_ignore_ascii_case("none") {
        return Err(SetError::InvalidKey(
            "unsigned SETs (`alg` none) are not accepted",
        ));
    }
    match alg.parse::<Algorithm>() {
        Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) => Err(SetError::InvalidKey(
            "HMAC-signed SETs are not accepted: the transmitter's keys are public keys",
        )),
        Ok(alg) => Ok(alg),
        Err(_) => Err(SetError::InvalidKey("the SET's `alg` is not supported")),
    }
}

/// `secevent+jwt`, or `application/secevent+jwt` (RFC 8417 §2.3), in any case.
fn is_secevent(typ: &str) -> bool {
    let typ = typ.to_ascii_lowercase();
    typ == "secevent+jwt" || typ == "application/secevent+jwt"
}

/// A failed fetch is worth a retry; a JWKS that is wrong is the transmitter's key problem.
fn keys_error(err: KeysError) -> SetError {
    if err.is_transient() {
        SetError::KeysUnavailable(err)
    } else {
        tracing::warn!(error = %err, "a SET transmitter's keys are unusable");
        SetError::InvalidKey("the transmitter's keys cannot be used to verify SETs")
    }
}

/// What `jsonwebtoken` refused, as an RFC 8935 error.
fn decode_error(kind: &ErrorKind) -> SetError {
    match kind {
        ErrorKind::InvalidSignature => {
            SetError::InvalidKey("the SET's signature does not verify with the transmitter's key")
        }
        ErrorKind::InvalidAlgorithm
        | ErrorKind::MissingAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::UnsupportedAlgorithm
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => {
            SetError::InvalidKey("the transmitter's key cannot verify the SET's `alg`")
        }
        ErrorKind::InvalidIssuer => {
            SetError::InvalidIssuer("the SET's `iss` is not this tenant's transmitter")
        }
        ErrorKind::InvalidAudience => SetError::InvalidAudience,
        ErrorKind::ExpiredSignature => SetError::InvalidRequest("the SET has expired (`exp`)"),
        ErrorKind::ImmatureSignature => {
            SetError::InvalidRequest("the SET is not valid yet (`nbf`)")
        }
        ErrorKind::MissingRequiredClaim(claim) if claim == "iss" => {
            SetError::InvalidIssuer("the SET has no `iss`")
        }
        ErrorKind::MissingRequiredClaim(claim) if claim == "aud" => SetError::InvalidAudience,
        ErrorKind::InvalidClaimFormat(_) | ErrorKind::MissingRequiredClaim(_) => {
            SetError::InvalidRequest("a registered claim of the SET is missing or malformed")
        }
        _ => SetError::InvalidRequest("the SET is not a well-formed signed JWT"),
    }
}

/// The claims of a verified SET (`iss` and `aud` were checked by `jsonwebtoken`).
fn read_claims(
    claims: &Map<String, Value>,
    now: OffsetDateTime,
    window: SetWindow,
) -> Result<VerifiedSet, SetError> {
    let text = |name: &str, missing: &'static str| {
        claims
            .get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.chars().count() <= MAX_CLAIM_CHARS)
            .ok_or(SetError::InvalidRequest(missing))
    };
    let issuer = text(
        "iss",
        "the SET's `iss` must be a string of at most 256 characters",
    )?;
    let jti = text("jti", "the SET must have a `jti` of 1 to 256 characters")?;
    let iat = numeric_date(claims.get("iat")).ok_or(SetError::InvalidRequest(
        "the SET must have a numeric `iat`",
    ))?;
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let (iat_secs, now_secs) = (iat.unix_timestamp(), now.unix_timestamp());
    if iat_secs < now_secs.saturating_sub(secs(window.max_age)) {
        return Err(SetError::InvalidRequest(
            "the SET was issued too long ago (`iat` is outside the accepted window)",
        ));
    }
    if iat_secs > now_secs.saturating_add(secs(window.max_ahead)) {
        return Err(SetError::InvalidRequest(
            "the SET's `iat` is ahead of the receiver's clock",
        ));
    }
    let events =
        claims
            .get("events")
            .and_then(Value::as_object)
            .ok_or(SetError::InvalidRequest(
                "the SET must have an `events` object",
            ))?;
    let mut members = events.iter();
    let (Some((event_type, event)), None) = (members.next(), members.next()) else {
        return Err(SetError::InvalidRequest(
            "the SET's `events` must hold exactly one event",
        ));
    };
    let event = event.as_object().ok_or(SetError::InvalidRequest(
        "the SET's event payload must be a JSON object",
    ))?;
    if event_type.is_empty() || event_type.chars().count() > MAX_CLAIM_CHARS {
        return Err(SetError::InvalidRequest(
            "the SET's event type must be a URI of at most 256 characters",
        ));
    }
    // RFC 9493 / OpenID SSF put the subject in `sub_id`; earlier RISC drafts in the event.
    let subject = claims
        .get("sub_id")
        .or_else(|| event.get("subject"))
        .ok_or(SetError::InvalidRequest(
            "the SET names no subject (`sub_id`)",
        ))
        .and_then(subject)?;
    let observed_at = numeric_date(claims.get("toe"))
        .or_else(|| numeric_date(event.get("event_timestamp")))
        .unwrap_or(iat);
    if observed_at > now + MAX_OBSERVED_AHEAD {
        return Err(SetError::InvalidRequest(
            "the SET's event time is more than 5 minutes ahead of the receiver's clock",
        ));
    }
    Ok(VerifiedSet {
        issuer: issuer.to_owned(),
        jti: jti.to_owned(),
        event_type: event_type.clone(),
        subject,
        observed_at,
    })
}

/// A JWT NumericDate (seconds, possibly fractional).
fn numeric_date(value: Option<&Value>) -> Option<OffsetDateTime> {
    let secs = value?.as_f64()?;
    if !secs.is_finite() {
        return None;
    }
    OffsetDateTime::from_unix_timestamp(secs.floor() as i64).ok()
}

/// An RFC 9493 subject identifier as our subject: `phone_number` is a phone; `email`,
/// `opaque`, `account` and `iss_sub` are accounts (the address, the id, the `acct:` URI, and
/// `<iss>|<sub>`); `aliases` uses its first identifier of those formats.
fn subject(value: &Value) -> Result<Subject, SetError> {
    let unsupported = SetError::InvalidRequest(
        "the SET's subject must be an RFC 9493 identifier of format phone_number, email, \
         opaque, account, iss_sub or aliases",
    );
    let id = value.as_object().ok_or(SetError::InvalidRequest(
        "the SET's subject must be a JSON object",
    ))?;
    let member = |name: &str| {
        id.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or(SetError::InvalidRequest(
                "a member the SET's subject format requires is missing",
            ))
    };
    let account = |value: String| {
        validate_account(value).map(Subject::Account).map_err(|_| {
            SetError::InvalidRequest(
                "the SET's subject identifier must be 1 to 256 characters with no control \
                 characters",
            )
        })
    };
    match id.get("format").and_then(Value::as_str) {
        Some("phone_number") => validate_phone(member("phone_number")?.to_owned())
            .map(Subject::Phone)
            .map_err(|_| {
                SetError::InvalidRequest("the SET's `phone_number` subject must be an E.164 number")
            }),
        Some("email") => account(member("email")?.to_owned()),
        Some("opaque") => account(member("id")?.to_owned()),
        Some("account") => account(member("uri")?.to_owned()),
        Some("iss_sub") => account(format!("{}|{}", member("iss")?, member("sub")?)),
        Some("aliases") => id
            .get("identifiers")
            .and_then(Value::as_array)
            .and_then(|ids| ids.iter().map(subject).find_map(Result::ok))
            .ok_or(unsupported),
        _ => Err(unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::RISC_CREDENTIAL_COMPROMISE;

    const NOW: OffsetDateTime = time::macros::datetime!(2026-11-30 12:00 UTC);

    fn claims(patch: Value) -> Map<String, Value> {
        let mut c = json!({
            "iss": "https://idp.example.com",
            "aud": "https://verdict.example.com",
            "iat": NOW.unix_timestamp() - 10,
            "jti": "4d3559ec67504aaba65d40b0363faad8",
            "sub_id": {"format": "email", "email": "alice@example.com"},
            "events": {RISC_CREDENTIAL_COMPROMISE: {"credential_type": "password"}},
        });
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c.as_object().unwrap().clone()
    }

    fn read(patch: Value) -> Result<VerifiedSet, SetError> {
        read_claims(&claims(patch), NOW, SetWindow::default())
    }

    #[test]
    fn a_risc_set_reads_as_one_event_about_one_subject() {
        let set = read(json!({})).unwrap();
        assert_eq!(set.event_type, RISC_CREDENTIAL_COMPROMISE);
        assert_eq!(set.subject, Subject::Account("alice@example.com".into()));
        assert_eq!(set.observed_at, NOW - time::Duration::seconds(10));
        let toe = read(json!({"toe": NOW.unix_timestamp() - 3600})).unwrap();
        assert_eq!(toe.observed_at, NOW - time::Duration::hours(1));
    }

    #[test]
    fn subject_formats_map_to_phones_and_accounts() {
        let cases = [
            (
                json!({"format": "phone_number", "phone_number": "+12065550100"}),
                Subject::Phone("+12065550100".into()),
            ),
            (
                json!({"format": "opaque", "id": "11112222333344445555"}),
                Subject::Account("11112222333344445555".into()),
            ),
            (
                json!({"format": "account", "uri": "acct:alice@example.com"}),
                Subject::Account("acct:alice@example.com".into()),
            ),
            (
                json!({"format": "iss_sub", "iss": "https://idp.example.com", "sub": "145234573"}),
                Subject::Account("https://idp.example.com|145234573".into()),
            ),
            (
                json!({"format": "aliases", "identifiers": [
                    {"format": "did", "url": "did:example:123"},
                    {"format": "phone_number", "phone_number": "+12065550100"}]}),
                Subject::Phone("+12065550100".into()),
            ),
        ];
        for (sub_id, expected) in cases {
            assert_eq!(read(json!({ "sub_id": sub_id })).unwrap().subject, expected);
        }
        // The legacy RISC place: inside the event.
        let legacy = read(
            json!({"sub_id": null, "events": {RISC_CREDENTIAL_COMPROMISE: {
            "subject": {"format": "phone_number", "phone_number": "+12065550100"}}}}),
        )
        .unwrap();
        assert_eq!(legacy.subject, Subject::Phone("+12065550100".into()));
    }

    #[test]
    fn refusals_name_the_claim_and_never_the_value() {
        let secret = "+12065550199";
        let cases = [
            json!({"jti": null}),
            json!({"iat": null}),
            json!({"iat": NOW.unix_timestamp() - 301}),
            json!({"iat": NOW.unix_timestamp() + 61}),
            json!({"events": {}}),
            json!({"events": {"a": {}, "b": {}}}),
            json!({"sub_id": null}),
            json!({"sub_id": {"format": "phone_number", "phone_number": "0012065550199"}}),
            json!({"sub_id": {"format": "did", "url": secret}}),
            json!({"toe": NOW.unix_timestamp() + 3600}),
        ];
        for patch in cases {
            let err = read(patch.clone()).unwrap_err();
            assert_eq!(err.code(), Some("invalid_request"), "{patch}");
            let text = err.to_string();
            assert!(!text.contains("2065550199"), "{patch}: {text}");
        }
    }

    #[test]
    fn the_iat_window_is_configurable() {
        let wide = SetWindow {
            max_age: Duration::from_secs(3600),
            max_ahead: Duration::from_secs(60),
        };
        let old = claims(json!({"iat": NOW.unix_timestamp() - 1800}));
        assert!(read_claims(&old, NOW, wide).is_ok());
        assert!(read_claims(&old, NOW, SetWindow::default()).is_err());
    }

    #[test]
    fn none_hmac_and_unknown_algorithms_are_refused_before_any_key() {
        let token = |header: Value| {
            format!(
                "{}.{}.",
                URL_SAFE_NO_PAD.encode(header.to_string()),
                URL_SAFE_NO_PAD.encode("{}")
            )
        };
        for alg in ["none", "None", "HS256", "HS512", "XS999"] {
            let err = header_algorithm(&token(json!({"alg": alg}))).unwrap_err();
            assert_eq!(err.code(), Some("invalid_key"), "{alg}");
        }
        assert_eq!(
            header_algorithm(&token(json!({"alg": "ES256"}))).unwrap(),
            Algorithm::ES256
        );
        for malformed in ["", "a.b", "a.b.c.d", "!!.b.c"] {
            let err = header_algorithm(malformed).unwrap_err();
            assert_eq!(err.code(), Some("invalid_request"), "{malformed}");
        }
    }
}
