//! `POST /v1/signals`: validate, authenticate, then hand over to the ingest pipeline.

use std::sync::LazyLock;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::signature::Signed;
use crate::app::AppState;
use crate::app::error::{ApiError, AuthError};
use crate::domain::Feed;
use crate::idempotency::{Fingerprint, IdempotencyKey, KeyError};
use crate::ingest::{Inbound, Reply};
use crate::problem::{PROBLEM_JSON, Problem};
use crate::signal::{Signal, SignalError};
use crate::store::{KeyGrant, Scope, SecretPurpose, StoredResponse};

/// Largest body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

// Header names and counters of the replay path, made once: parsing a name or looking a counter
// up on every request was a measurable part of a replay.
static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
static SIGNALS: LazyLock<metrics::Counter> =
    LazyLock::new(|| metrics::counter!("verdict_signals_total"));
static REPLAYS: LazyLock<metrics::Counter> =
    LazyLock::new(|| metrics::counter!("verdict_replays_total"));

/// Accepts one signal.
#[utoipa::path(post, path = "/v1/signals", operation_id = "post_signal", tag = "signals",
    request_body(content = crate::signal::WireSignal, content_type = "application/json"),
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters, bare or as a quoted Structured Field string",
            pattern = r#"^(?:[!#-~][!-~]{0,254}|"(?:[!#-\[\]-~]|\\["\\]){1,255}")$"#),
        ("Verdict-Timestamp" = Option<String>, Header, description = "Unix seconds, within 300 s of the server's clock. Required, with `Verdict-Signature`, unless the tenant turned inbound signatures off (ignored then) or the signal is signed per Standard Webhooks"),
        ("Verdict-Signature" = Option<String>, Header, description = "v2,<base64 HMAC-SHA256(secret, \"{timestamp}.{Idempotency-Key}.{body}\")>, space-separated during rotation (an empty key for a keyless signal); tenants set up before keys were signed also take v1 over \"{timestamp}.{body}\" until turned off; see `Verdict-Timestamp`"),
        ("webhook-id" = Option<String>, Header, description = "Standard Webhooks: the message id, which is the signal's idempotency key (an `Idempotency-Key` sent beside it must be the same)"),
        ("webhook-timestamp" = Option<String>, Header, description = "Standard Webhooks: unix seconds, within 300 s of the server's clock"),
        ("webhook-signature" = Option<String>, Header, description = "Standard Webhooks: v1,<base64 HMAC-SHA256(secret, \"{webhook-id}.{webhook-timestamp}.{body}\")>, space-separated during rotation; taken instead of `Verdict-Signature`"),
    ),
    responses(
        (status = 200, body = crate::ingest::SignalResponse, description = "The decision; with `Idempotent-Replayed: true` when replayed"),
        (status = 400, body = Problem, description = "Invalid request"), (status = 401, body = Problem, description = "Not authenticated"),
        (status = 403, body = Problem, description = "The API key's scope is not `ingest` or `admin`"), (status = 409, body = Problem, description = "In progress; retry after `Retry-After`"),
        (status = 413, body = Problem, description = "Payload too large"), (status = 415, body = Problem, description = "Unsupported media type"),
        (status = 422, body = Problem, description = "The key was used with another payload"),
        (status = 429, body = Problem, description = "Over the tenant's rate limit; retry after `Retry-After`"),
        (status = 503, body = Problem, description = "Transient; retry with the same key"),
    ))]
pub async fn post_signal(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // 1. Validate without a round trip; a request with no API key at all is a 401 before
    // anything else is said about it.
    super::auth::bearer(&headers).ok_or(AuthError::MissingApiKey)?;
    let key = signal_key(&headers)?;
    require_json(&headers)?;
    let body = super::body::read_limited(&headers, body, MAX_BODY_BYTES).await?;
    let raw_body: [u8; 32] = Sha256::digest(&body).into();
    if let Some(key) = &key
        && let Some(replay) = replay_same_bytes(&app, &headers, &body, key, &raw_body).await
    {
        return Ok(replay);
    }
    // 2. Authenticate over the raw bytes and admit before any JSON parse, so a request
    // without a valid key (and signature) costs no more than reading it.
    let grant = authenticate(&app, &headers, &body).await?;
    app.rate_limits.admit(&grant.tenant)?;
    app.quota.admit(&grant.tenant)?;
    let tenant = grant.tenant;

    // 3. Parse: nothing before this point claimed or wrote anything.
    let (signal, value) = Signal::parse(&body, crate::clock::now_utc())?;
    let fingerprint = Fingerprint::of(&value).map_err(|err| {
        tracing::debug!(error = ?err, "a signal could not be canonicalised");
        SignalError::Schema("the body cannot be put in RFC 8785 canonical form".into())
    })?;

    // 4–6. Claim, act, persist.
    SIGNALS.increment(1);
    let reply = app
        .ingest
        .run(Inbound {
            tenant: &tenant,
            feed: Feed::Signals,
            key,
            signal,
            fingerprint,
            raw_body,
            request_span: tracing::Span::current(),
        })
        .await
        .inspect_err(|err| {
            let name = match err {
                crate::ingest::IngestError::InProgress => "verdict_key_conflicts_total",
                crate::ingest::IngestError::KeyReused => "verdict_key_mismatches_total",
                _ => "verdict_ingest_failures_total",
            };
            metrics::counter!(name).increment(1);
        })?;
    Ok(match reply {
        Reply::Fresh(stored) => {
            app.quota.stored(tenant.id);
            stored_response(stored, false)
        }
        Reply::Replayed(stored) => {
            REPLAYS.increment(1);
            stored_response(stored, true)
        }
    })
}

/// A retry with the very bytes of a completed request (what a well-behaved client sends):
/// authenticated from in-memory credentials alone (a cached, unrevoked key with a scope that
/// allows ingest), then replayed from the cache with no parsing and no database round trip,
/// within the tenant's rate limit. Anything else (an uncached key, a failed check) takes the
/// full path, so its answers and their order are unchanged.
async fn replay_same_bytes(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    key: &IdempotencyKey,
    raw_body: &[u8; 32],
) -> Option<Response> {
    let grant = app
        .credentials
        .cached_grant(super::auth::bearer(headers)?)
        .await?;
    if super::auth::require_scope(&grant, Scope::Ingest).is_err() {
        return None;
    }
    let tenant = &grant.tenant;
    if tenant.inbound_signature_required {
        let secrets = app
            .credentials
            .cached_secrets(tenant.id, SecretPurpose::Inbound)
            .await?;
        let signed = Signed::read(headers, body).ok()?;
        signed
            .by(&secrets, tenant.inbound_signature_covers_key)
            .ok()?;
    }
    let stored = app.ingest.replay_same_bytes(tenant.id, key, raw_body)?;
    if let Err(limited) = app.rate_limits.admit(tenant) {
        return Some(ApiError::from(limited).into_response());
    }
    SIGNALS.increment(1);
    REPLAYS.increment(1);
    Some(respond(stored.status, Body::from(stored.body), true))
}

/// The signal's idempotency key: its `Idempotency-Key`, or a Standard Webhooks sender's
/// `webhook-id` (which the signature covers); when both are sent they must be the same.
fn signal_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let key = idempotency_key(headers)?;
    let mut ids = headers.get_all(&WEBHOOK_ID).iter();
    let Some(id) = ids.next() else {
        return Ok(key);
    };
    if ids.next().is_some() {
        return Err(KeyError::Repeated);
    }
    let id = IdempotencyKey::parse(id.as_bytes())?;
    match key {
        Some(key) if key != id => Err(KeyError::DiffersFromWebhookId),
        _ => Ok(Some(id)),
    }
}

/// The request's `Idempotency-Key`, if it has one, checked (sent at most once).
pub(super) fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    IdempotencyKey::parse(first.as_bytes()).map(Some)
}

fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (first, repeated) = (values.next(), values.next().is_some());
    if repeated {
        return Err(ApiError::UnsupportedMediaType);
    }
    let essence = first
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    match essence {
        Some(t) if t.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(ApiError::UnsupportedMediaType),
    }
}

/// The API key and its scope, then the signature over the exact bytes (and the key).
async fn authenticate(
    app: &AppState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<KeyGrant, ApiError> {
    let api_key = super::auth::bearer(headers).ok_or(AuthError::MissingApiKey)?;
    let grant = app
        .credentials
        .grant(api_key)
        .await?
        .ok_or(AuthError::InvalidApiKey)?;
    super::auth::require_scope(&grant, Scope::Ingest)?;
    let tenant = &grant.tenant;
    if !tenant.inbound_signature_required {
        return Ok(grant);
    }
    let signed = Signed::read(headers, body)?;
    // The cached secrets first; on a mismatch the stored ones, so a secret rotated in a
    // moment ago works at once (a retired one stops at its own time either way).
    let mut refused = AuthError::BadSignature;
    for fresh in [false, true] {
        let secrets = app
            .credentials
            .secrets(tenant.id, SecretPurpose::Inbound, fresh)
            .await?;
        match signed.by(&secrets, tenant.inbound_signature_covers_key) {
            Ok(()) => return Ok(grant),
            Err(err) => refused = err,
        }
    }
    Err(refused.into())
}

/// A stored response as sent (marked `Idempotent-Replayed: true` when `replayed`).
pub(super) fn stored_response(stored: StoredResponse, replayed: bool) -> Response {
    respond(stored.status, Body::from(stored.body), replayed)
}

/// A stored answer's status and body as sent.
fn respond(status: u16, body: Body, replayed: bool) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_JSON
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if replayed {
        headers.insert(
            IDEMPOTENT_REPLAYED.clone(),
            HeaderValue::from_static("true"),
        );
    }
    response
}
