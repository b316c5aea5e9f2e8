//! The standard feeds' endpoints: `POST /v1/sets` (Security Event Tokens pushed per RFC 8935)
//! and `POST /v1/camara/sim-swap` (CAMARA SIM Swap notifications). Each validates without a
//! round trip, authenticates an `ingest` API key, admits the tenant's rate limit, verifies the
//! event, and hands it to the same ingest pipeline as `POST /v1/signals` under its natural
//! idempotency key. Nothing before the pipeline claims or writes anything, and each endpoint
//! answers errors in its own standard's form.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::app::error::{ApiError, AuthError};
use crate::domain::Feed;
use crate::feeds::camara::{self, CamaraError, SwapError};
use crate::feeds::set::SetError;
use crate::idempotency::Fingerprint;
use crate::ingest::{FeedEvent, Inbound, IngestError, Reply};
use crate::problem::Problem;
use crate::signal::SignalType;
use crate::store::{KeyGrant, StoreError};

/// Largest SET or notification accepted, as for signals.
pub const MAX_FEED_BODY_BYTES: usize = 64 * 1024;

/// The media type of a SET (RFC 8417 §2.3).
const SECEVENT_JWT: &str = "application/secevent+jwt";

/// An RFC 8935 §2.3 error body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SetErrorBody {
    /// `invalid_request`, `invalid_key`, `invalid_issuer`, `invalid_audience`,
    /// `authentication_failed` or `access_denied`.
    err: &'static str,
    /// What was wrong; it never repeats what the token held.
    description: String,
}

/// The CAMARA error body (`ErrorInfo`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CamaraErrorBody {
    status: u16,
    /// e.g. `INVALID_ARGUMENT`, `UNAUTHENTICATED`, `PERMISSION_DENIED`, `MISSING_IDENTIFIER`.
    code: &'static str,
    message: String,
}

/// Accepts one Security Event Token.
#[utoipa::path(post, path = "/v1/sets", operation_id = "post_set", tag = "feeds",
    request_body(content = String, content_type = "application/secevent+jwt",
        description = "A SET (RFC 8417): a compact JWS signed by the tenant's transmitter (`verdict tenant set-transmitter`), with `iss`, `aud`, `iat`, `jti`, one event in `events`, and `sub_id` (RFC 9493)"),
    responses(
        (status = 202, description = "Accepted: decided once, however often it is pushed (empty body)"),
        (status = 400, body = SetErrorBody, description = "RFC 8935 error: `invalid_request`, `invalid_key`, `invalid_issuer` or `invalid_audience`"),
        (status = 401, body = SetErrorBody, description = "`authentication_failed`: no valid API key"),
        (status = 403, body = SetErrorBody, description = "`access_denied`: the API key's scope is not `ingest` or `admin`"),
        (status = 409, body = Problem, description = "The same SET is being processed; retry after `Retry-After`"),
        (status = 413, body = SetErrorBody, description = "`invalid_request`: larger than 64 KiB"),
        (status = 415, body = SetErrorBody, description = "`invalid_request`: not application/secevent+jwt"),
        (status = 429, body = Problem, description = "Over the tenant's rate limit; retry after `Retry-After`"),
        (status = 503, body = Problem, description = "Transient (storage, or the transmitter's JWKS could not be fetched); retry"),
    ))]
#[tracing::instrument(skip_all, fields(feed = "set"))]
pub async fn post_set(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    match receive_set(&app, &headers, body).await {
        Ok(()) => StatusCode::ACCEPTED.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn receive_set(app: &AppState, headers: &HeaderMap, body: Body) -> Result<(), SetRefusal> {
    // 1. Validate without a round trip; a request with no API key at all is a 401 before
    // anything else is said about it.
    super::auth::bearer(headers).ok_or(ApiError::from(AuthError::MissingApiKey))?;
    if !has_media_type(headers, &[SECEVENT_JWT]) {
        return Err(ApiError::UnsupportedMediaType.into());
    }
    let body = super::body::read_limited(headers, body, MAX_FEED_BODY_BYTES).await?;
    let token = std::str::from_utf8(&body)
        .map(str::trim)
        .map_err(|_| SetError::InvalidRequest("the body is not a compact JWS"))?;

    // 2. Authenticate and admit.
    let grant = grant(app, headers).await?;
    let tenant = super::auth::admit_feed(&grant, Feed::Set, &app.rate_limits)?;
    app.quota.admit(tenant).map_err(ApiError::from)?;

    // 3. Verify: signature, issuer, audience, window, claims.
    let set = app
        .sets
        .verify(tenant.id, token, crate::clock::now_utc())
        .await?;

    // 4. Map with the playbook in force, then claim, decide, act and send (or record it as
    //    ignored) under (`iss`, `jti`).
    let (playbook, version) = app.ingest.playbook_in_force(tenant.id).await?;
    let signal_type = playbook.set_event_signal(&set.event_type);
    let key = set.key();
    let fingerprint = Fingerprint(Sha256::digest(token.as_bytes()).into());
    let raw_body: [u8; 32] = Sha256::digest(&body).into();
    metrics::counter!("verdict_feed_events_total", "feed" => "set", "mapped" => mapped(signal_type))
        .increment(1);
    let event = FeedEvent {
        tenant,
        feed: Feed::Set,
        attributes: set.attributes(),
        metadata: set.metadata(),
        subject: set.subject,
        observed_at: set.observed_at,
        fingerprint,
        raw_body,
        playbook_version: version,
    };
    let reply = match signal_type {
        Some(signal_type) => run(app, event.into_signal(key, signal_type)).await?,
        None => app.ingest.record_ignored(event, key).await?,
    };
    if matches!(reply, Reply::Fresh(_)) {
        app.quota.stored(tenant.id);
    }
    settled(reply)?;
    Ok(())
}

/// Accepts one CAMARA SIM Swap notification.
#[utoipa::path(post, path = "/v1/camara/sim-swap", operation_id = "post_camara_sim_swap", tag = "feeds",
    request_body(content = crate::feeds::camara::CloudEvent, content_type = "application/cloudevents+json",
        description = "A CloudEvents 1.0 notification of the CAMARA sim-swap-subscriptions API; authenticated by the `sinkCredential` bearer token, an `ingest` API key"),
    responses(
        (status = 204, description = "Received: a swap is decided once, however often it is delivered; lifecycle events are acknowledged"),
        (status = 400, body = CamaraErrorBody, description = "`INVALID_ARGUMENT`: not a notification we accept (including a body over 64 KiB or of another media type)"),
        (status = 401, body = CamaraErrorBody, description = "`UNAUTHENTICATED`"),
        (status = 403, body = CamaraErrorBody, description = "`PERMISSION_DENIED`: the API key's scope is not `ingest` or `admin`"),
        (status = 409, body = CamaraErrorBody, description = "`ABORTED` (the same event is being processed; retry after `Retry-After`) or `ALREADY_EXISTS` (its `source` and `id` came with other content)"),
        (status = 422, body = CamaraErrorBody, description = "`MISSING_IDENTIFIER`: no `phoneNumber` and no registered subscription"),
        (status = 429, body = CamaraErrorBody, description = "`TOO_MANY_REQUESTS`; retry after `Retry-After`"),
        (status = 503, body = CamaraErrorBody, description = "`UNAVAILABLE`; retry"),
    ))]
#[tracing::instrument(skip_all, fields(feed = "camara"))]
pub async fn post_camara_sim_swap(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match receive_camara(&app, &headers, body).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

async fn receive_camara(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(), CamaraRefusal> {
    // 1. Validate without a round trip; a request with no API key at all is a 401 before
    // anything else is said about it.
    super::auth::bearer(headers).ok_or(ApiError::from(AuthError::MissingApiKey))?;
    if !has_media_type(
        headers,
        &["application/cloudevents+json", "application/json"],
    ) {
        return Err(ApiError::UnsupportedMediaType.into());
    }
    let body = super::body::read_limited(headers, body, MAX_FEED_BODY_BYTES).await?;

    // 2. Authenticate and admit before any JSON parse: without a valid key a request costs
    // no more than reading it.
    let grant = grant(app, headers).await?;
    let tenant = super::auth::admit_feed(&grant, Feed::Camara, &app.rate_limits)?;
    app.quota.admit(tenant).map_err(ApiError::from)?;

    let (notification, value) = camara::parse(&body, crate::clock::now_utc())?;
    let fingerprint = Fingerprint::of(&value)
        .map_err(|_| CamaraError("the notification cannot be put in RFC 8785 canonical form"))?;

    // 3. The signal (none for a lifecycle event): about the number sent, or the one
    //    registered for the subscription.
    let Some(swap) = camara::signal(&*app.store, &app.keys, tenant.id, notification).await? else {
        return Ok(());
    };

    // 4. Claim, decide, act and send under (`source`, `id`).
    let reply = run(
        app,
        Inbound {
            tenant,
            feed: Feed::Camara,
            key: Some(swap.key),
            signal: swap.signal,
            fingerprint,
            raw_body: Sha256::digest(&body).into(),
            request_span: tracing::Span::current(),
        },
    )
    .await?;
    settled(reply).map_err(CamaraRefusal::Api)?;
    Ok(())
}

/// Runs a feed signal through the pipeline, counting it as signals are counted.
async fn run(app: &AppState, inbound: Inbound<'_>) -> Result<Reply, ApiError> {
    metrics::counter!("verdict_signals_total").increment(1);
    let tenant_id = inbound.tenant.id;
    let reply = app.ingest.run(inbound).await.map_err(|err| {
        let name = match err {
            IngestError::InProgress => "verdict_key_conflicts_total",
            IngestError::KeyReused => "verdict_key_mismatches_total",
            _ => "verdict_ingest_failures_total",
        };
        metrics::counter!(name).increment(1);
        ApiError::from(err)
    })?;
    if matches!(reply, Reply::Fresh(_)) {
        app.quota.stored(tenant_id);
    }
    Ok(reply)
}

/// A fresh or replayed outcome: a decision (or an ignored event) is success; a final failure
/// stored on the key is answered as the failure it was.
fn settled(reply: Reply) -> Result<(), ApiError> {
    let stored = match reply {
        Reply::Fresh(stored) => stored,
        Reply::Replayed(stored) => {
            metrics::counter!("verdict_replays_total").increment(1);
            stored
        }
    };
    if stored.status < 400 {
        Ok(())
    } else {
        Err(ApiError::Store(StoreError::Corrupt(
            "this event failed permanently when it was first received".into(),
        )))
    }
}

/// The API key behind the request (no scope check yet).
async fn grant(app: &AppState, headers: &HeaderMap) -> Result<KeyGrant, ApiError> {
    let api_key = super::auth::bearer(headers).ok_or(AuthError::MissingApiKey)?;
    Ok(app
        .credentials
        .grant(api_key)
        .await?
        .ok_or(AuthError::InvalidApiKey)?)
}

/// Whether the one `Content-Type` header's essence is one of `accepted`.
fn has_media_type(headers: &HeaderMap, accepted: &[&str]) -> bool {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(first), None) = (values.next(), values.next()) else {
        return false;
    };
    first
        .to_str()
        .ok()
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .is_some_and(|essence| accepted.iter().any(|a| essence.eq_ignore_ascii_case(a)))
}

fn mapped(signal_type: Option<SignalType>) -> &'static str {
    if signal_type.is_some() {
        "true"
    } else {
        "false"
    }
}

/// Why a SET was refused: RFC 8935's form for what is the request's fault; the API's problem
/// responses for the rest (in progress, rate limited, unavailable), which a transmitter retries.
#[derive(Debug)]
enum SetRefusal {
    Set(SetError),
    Api(ApiError),
}

/// The `From`s a refusal needs: from the feed's own error (into `$variant`) and from the API
/// layer's errors (into `Api`).
macro_rules! refusal_from {
    ($refusal:ident, $variant:ident($own:ty)) => {
        impl From<$own> for $refusal {
            fn from(err: $own) -> Self {
                Self::$variant(err)
            }
        }

        impl From<ApiError> for $refusal {
            fn from(err: ApiError) -> Self {
                Self::Api(err)
            }
        }

        impl From<IngestError> for $refusal {
            fn from(err: IngestError) -> Self {
                Self::Api(err.into())
            }
        }

        impl From<StoreError> for $refusal {
            fn from(err: StoreError) -> Self {
                Self::Api(err.into())
            }
        }
    };
}

refusal_from!(SetRefusal, Set(SetError));

/// An RFC 8935 error response.
fn rfc8935(status: StatusCode, err: &'static str, description: impl Into<String>) -> Response {
    tracing::info!(err, status = status.as_u16(), "SET refused");
    let body = SetErrorBody {
        err,
        description: description.into(),
    };
    (status, axum::Json(body)).into_response()
}

impl IntoResponse for SetRefusal {
    fn into_response(self) -> Response {
        match self {
            Self::Set(err) => match err.code() {
                Some(code) => rfc8935(StatusCode::BAD_REQUEST, code, err.to_string()),
                None => match err {
                    SetError::Store(store) => ApiError::Store(store).into_response(),
                    other => {
                        tracing::warn!(error = ?other, "a SET could not be verified now");
                        Problem::unavailable()
                            .detail("The transmitter's keys could not be fetched; push the SET again later.")
                            .into_response()
                    }
                },
            },
            Self::Api(err) => match err {
                ApiError::Auth(auth) => {
                    let mut response = rfc8935(
                        StatusCode::UNAUTHORIZED,
                        "authentication_failed",
                        auth.to_string(),
                    );
                    response.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        HeaderValue::from_static("Bearer realm=\"verdict\""),
                    );
                    response
                }
                ApiError::InsufficientScope { .. } => rfc8935(
                    StatusCode::FORBIDDEN,
                    "access_denied",
                    "pushing SETs needs an API key with the `ingest` scope, or an `admin` key",
                ),
                ApiError::FeedKeyElsewhere(_) | ApiError::FeedNeedsItsOwnKey(_) => {
                    rfc8935(StatusCode::FORBIDDEN, "access_denied", err.to_string())
                }
                ApiError::TooLarge(_) => rfc8935(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request",
                    format!("the SET is larger than {MAX_FEED_BODY_BYTES} bytes"),
                ),
                ApiError::UnsupportedMediaType => rfc8935(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "invalid_request",
                    "the body must be application/secevent+jwt",
                ),
                ApiError::UnreadableBody | ApiError::BodyTimeout => {
                    rfc8935(StatusCode::BAD_REQUEST, "invalid_request", err.to_string())
                }
                ApiError::Ingest(IngestError::KeyReused) => rfc8935(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "the SET's `jti` was already used by this issuer with a different token",
                ),
                other => other.into_response(),
            },
        }
    }
}

/// Why a CAMARA notification was refused, answered in CAMARA's error form.
#[derive(Debug)]
enum CamaraRefusal {
    Invalid(CamaraError),
    /// No `phoneNumber`, and the subscription is not registered.
    MissingIdentifier,
    Api(ApiError),
}

refusal_from!(CamaraRefusal, Invalid(CamaraError));

impl From<SwapError> for CamaraRefusal {
    fn from(err: SwapError) -> Self {
        match err {
            SwapError::MissingIdentifier => Self::MissingIdentifier,
            SwapError::Store(store) => store.into(),
        }
    }
}

/// A CAMARA error response.
fn camara_error(status: StatusCode, code: &'static str, message: impl Into<String>) -> Response {
    if status.is_server_error() {
        tracing::warn!(code, "CAMARA notification failed");
    } else {
        tracing::info!(
            code,
            status = status.as_u16(),
            "CAMARA notification refused"
        );
    }
    let body = CamaraErrorBody {
        status: status.as_u16(),
        code,
        message: message.into(),
    };
    (status, axum::Json(body)).into_response()
}

impl IntoResponse for CamaraRefusal {
    fn into_response(self) -> Response {
        let invalid =
            |message: String| camara_error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", message);
        match self {
            Self::Invalid(err) => invalid(err.to_string()),
            Self::MissingIdentifier => camara_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "MISSING_IDENTIFIER",
                "The notification has no `data.phoneNumber` and its subscription is not \
                 registered (`verdict camara subscription add`).",
            ),
            Self::Api(err) => {
                let problem = err.problem();
                let mut response = match &err {
                    ApiError::Auth(_) => camara_error(
                        StatusCode::UNAUTHORIZED,
                        "UNAUTHENTICATED",
                        "Request not authenticated due to missing, invalid, or expired credentials.",
                    ),
                    ApiError::InsufficientScope { .. } => camara_error(
                        StatusCode::FORBIDDEN,
                        "PERMISSION_DENIED",
                        "Notifications need an API key with the `ingest` scope, or an `admin` key.",
                    ),
                    ApiError::FeedKeyElsewhere(_) | ApiError::FeedNeedsItsOwnKey(_) => {
                        camara_error(StatusCode::FORBIDDEN, "PERMISSION_DENIED", err.to_string())
                    }
                    ApiError::RateLimited(_) => camara_error(
                        StatusCode::TOO_MANY_REQUESTS,
                        "TOO_MANY_REQUESTS",
                        "Rate limit reached.",
                    ),
                    ApiError::TooLarge(_) => invalid(format!(
                        "The notification is larger than {MAX_FEED_BODY_BYTES} bytes."
                    )),
                    ApiError::UnsupportedMediaType => {
                        invalid("The body must be application/cloudevents+json.".into())
                    }
                    ApiError::UnreadableBody | ApiError::BodyTimeout => invalid(err.to_string()),
                    ApiError::Ingest(IngestError::InProgress) => camara_error(
                        StatusCode::CONFLICT,
                        "ABORTED",
                        "A notification with this `source` and `id` is being processed; retry.",
                    ),
                    ApiError::Ingest(IngestError::KeyReused) => camara_error(
                        StatusCode::CONFLICT,
                        "ALREADY_EXISTS",
                        "A notification with this `source` and `id` was received with other content.",
                    ),
                    _ if problem.status == 503 => {
                        tracing::warn!(error = ?err, "CAMARA notification could not be stored now");
                        camara_error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "UNAVAILABLE",
                            "Service temporarily unavailable; retry.",
                        )
                    }
                    _ => {
                        tracing::error!(error = ?err, "CAMARA notification failed");
                        camara_error(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "INTERNAL",
                            "Unknown server error.",
                        )
                    }
                };
                if let Some(retry) = problem_retry_after(&err) {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from(retry));
                }
                response
            }
        }
    }
}

/// The `Retry-After` the API's own answer to this error carries, if any.
fn problem_retry_after(err: &ApiError) -> Option<u32> {
    match err {
        ApiError::RateLimited(limited) => Some(limited.retry_after_secs),
        ApiError::Ingest(IngestError::InProgress) => Some(2),
        _ if err.problem().status == 503 => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_match_by_essence_and_once() {
        let mut headers = HeaderMap::new();
        assert!(!has_media_type(&headers, &[SECEVENT_JWT]));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("Application/SecEvent+JWT; charset=utf-8"),
        );
        assert!(has_media_type(&headers, &[SECEVENT_JWT]));
        headers.append(header::CONTENT_TYPE, HeaderValue::from_static(SECEVENT_JWT));
        assert!(!has_media_type(&headers, &[SECEVENT_JWT]));
    }
}
