//! The API's error type: every failure a handler can meet, mapped once to a problem response.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::connectors::ConnectorError;
use crate::delivery::resolve::ResolveError;
use crate::domain::Feed;
use crate::endpoints::EndpointError;
use crate::idempotency::KeyError;
use crate::ingest::IngestError;
use crate::playbook::simulation::SimulationError;
use crate::playbook::{PlaybookError, PlaybookStoreError};
use crate::problem::Problem;
use crate::rate_limit::RateLimited;
use crate::signal::SignalError;
use crate::store::{Scope, StoreError};
use crate::subjects::SubjectError;
use crate::tenant::TenantError;

/// Why authentication failed. The messages never repeat what the client sent.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("send the tenant API key as `Authorization: Bearer <key>`")]
    MissingApiKey,
    #[error("the API key is not valid")]
    InvalidApiKey,
    #[error(
        "this tenant requires signed signals: `Verdict-Timestamp` and `Verdict-Signature`, or \
         Standard Webhooks' `webhook-id`, `webhook-timestamp` and `webhook-signature`"
    )]
    MissingSignature,
    #[error("the signature's timestamp must be unix seconds")]
    MalformedTimestamp,
    #[error("the signature's timestamp is more than 300 seconds from the server's clock")]
    StaleTimestamp,
    #[error("no signature matches the body")]
    BadSignature,
    #[error(
        "this tenant requires a signature that covers the idempotency key: `Verdict-Signature: \
         v2,…` over `{{timestamp}}.{{Idempotency-Key}}.{{body}}`, or Standard Webhooks (whose \
         `webhook-id` is the key); a `v1` signature alone is not taken"
    )]
    KeyNotSigned,
}

/// Everything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Signal(#[from] SignalError),
    #[error("the body must be application/json")]
    UnsupportedMediaType,
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the body could not be read")]
    UnreadableBody,
    #[error("the body was not received within the body read timeout")]
    BodyTimeout,
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error("the API key's scope ({has}) does not allow this request, which needs {needed}")]
    InsufficientScope { needed: Scope, has: Scope },
    #[error("the API key is made for the {0} feed alone")]
    FeedKeyElsewhere(Feed),
    #[error("this tenant requires signed signals, and the {0} feed cannot carry a signature")]
    FeedNeedsItsOwnKey(Feed),
    #[error(transparent)]
    RateLimited(#[from] RateLimited),
    #[error(transparent)]
    QuotaExceeded(#[from] crate::quota::QuotaExceeded),
    #[error(transparent)]
    Ingest(#[from] IngestError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tenant(#[from] TenantError),
    #[error(transparent)]
    Playbook(#[from] PlaybookStoreError),
    #[error(transparent)]
    Simulation(#[from] SimulationError),
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    #[error(transparent)]
    Subject(#[from] SubjectError),
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Invalid(String),
    #[error("conflict")]
    Conflict(Problem),
    /// A route whose parameters do not fit its handler: a bug, not the client's fault.
    #[error("the request's parameters could not be extracted: {0}")]
    Extraction(String),
}

impl ApiError {
    /// The problem this error is shown as.
    pub fn problem(&self) -> Problem {
        match self {
            Self::Key(e) => Problem::invalid_idempotency_key(e.to_string()),
            Self::Signal(e) => Problem::invalid_request(e.to_string()),
            Self::UnsupportedMediaType => Problem::new(
                "unsupported-media-type",
                "Unsupported media type",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            )
            .detail(self.to_string()),
            Self::TooLarge(_) => Problem::new(
                "payload-too-large",
                "Payload too large",
                StatusCode::PAYLOAD_TOO_LARGE,
            )
            .detail(self.to_string()),
            Self::UnreadableBody => Problem::invalid_request(self.to_string()),
            Self::BodyTimeout => Problem::new(
                "request-timeout",
                "Request timeout",
                StatusCode::REQUEST_TIMEOUT,
            )
            .detail(self.to_string()),
            Self::Auth(e) => {
                let slug = match e {
                    AuthError::MissingApiKey | AuthError::InvalidApiKey => "invalid-api-key",
                    AuthError::StaleTimestamp | AuthError::MalformedTimestamp => "stale-timestamp",
                    AuthError::MissingSignature
                    | AuthError::BadSignature
                    | AuthError::KeyNotSigned => "invalid-signature",
                };
                Problem::unauthorized(slug, e.to_string())
            }
            Self::FeedKeyElsewhere(feed) => Problem::new(
                "insufficient-scope",
                "The API key's scope does not allow this request",
                StatusCode::FORBIDDEN,
            )
            .detail(format!(
                "This key is made for the `{feed}` feed alone; this request needs another key."
            )),
            Self::FeedNeedsItsOwnKey(feed) => Problem::new(
                "insufficient-scope",
                "The API key's scope does not allow this request",
                StatusCode::FORBIDDEN,
            )
            .detail(format!(
                "This tenant requires signed signals and the `{feed}` feed cannot carry a \
                 signature: it takes an ingest key made for it alone (`verdict tenant key \
                 create --scope ingest --feed {feed}`, or `\"feed\": \"{feed}\"` in `POST /v1/keys`)."
            )),
            Self::Tenant(e @ TenantError::FeedKey) => Problem::invalid_request(e.to_string()),
            Self::InsufficientScope { needed, .. } => Problem::new(
                "insufficient-scope",
                "The API key's scope does not allow this request",
                StatusCode::FORBIDDEN,
            )
            .detail(format!(
                "This request needs a key with the `{needed}` scope, or an `admin` key."
            )),
            Self::QuotaExceeded(exceeded) => Problem::new(
                "quota-exceeded",
                "The tenant's daily quota is used up",
                StatusCode::TOO_MANY_REQUESTS,
            )
            .detail(format!(
                "The tenant stored its {} events for today (UTC); retry after the Retry-After \
                 interval, when the day ends.",
                exceeded.max
            ))
            .retry_after(exceeded.retry_after_secs),
            Self::RateLimited(limited) => Problem::new(
                "rate-limited",
                "Too many requests",
                StatusCode::TOO_MANY_REQUESTS,
            )
            .detail("The tenant's rate limit is exceeded; retry after the Retry-After interval.")
            .retry_after(limited.retry_after_secs),
            Self::Ingest(IngestError::InProgress) => in_progress(),
            Self::Ingest(IngestError::KeyReused) => key_reused("signal"),
            Self::Playbook(PlaybookStoreError::Invalid(e)) => match e {
                PlaybookError::Invalid(_) => Problem::new(
                    "invalid-playbook",
                    "The playbook is invalid",
                    StatusCode::BAD_REQUEST,
                ),
                PlaybookError::TooLarge(_) => Problem::new(
                    "payload-too-large",
                    "Payload too large",
                    StatusCode::PAYLOAD_TOO_LARGE,
                ),
                PlaybookError::OverLimit(_) => Problem::new(
                    "playbook-limit-exceeded",
                    "The playbook is over a limit",
                    StatusCode::UNPROCESSABLE_ENTITY,
                ),
            }
            .detail(e.to_string()),
            Self::Playbook(PlaybookStoreError::Store(e)) if e.is_transient() => {
                Problem::unavailable()
            }
            Self::Ingest(IngestError::Unavailable(_)) => Problem::unavailable(),
            Self::Simulation(e @ SimulationError::AlreadyRunning(_)) => Problem::new(
                "simulation-in-progress",
                "A simulation is already running",
                StatusCode::TOO_MANY_REQUESTS,
            )
            .detail(e.to_string())
            .retry_after(1),
            Self::Simulation(SimulationError::Store(e)) if e.is_transient() => {
                Problem::unavailable()
            }
            Self::Store(e) if e.is_transient() => Problem::unavailable(),
            Self::Connector(ConnectorError::Store(e)) if e.is_transient() => Problem::unavailable(),
            Self::Connector(ConnectorError::TooMany) => Problem::new(
                "connector-limit-exceeded",
                "The tenant has the most connectors it may have",
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .detail(ConnectorError::TooMany.to_string()),
            Self::Connector(ConnectorError::NotFound(_)) => Problem::not_found(),
            Self::Connector(e) if e.is_input() => Problem::invalid_request(e.to_string()),
            Self::Endpoint(EndpointError::Store(e)) if e.is_transient() => Problem::unavailable(),
            Self::Endpoint(EndpointError::TooMany) => Problem::new(
                "endpoint-limit-exceeded",
                "The tenant has the most callback endpoints it may have",
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .detail(EndpointError::TooMany.to_string()),
            Self::Endpoint(EndpointError::NotFound(_) | EndpointError::NoTenant) => {
                Problem::not_found()
            }
            Self::Endpoint(e) if e.is_input() => Problem::invalid_request(e.to_string()),
            Self::Tenant(e @ TenantError::TooManyEndpoints) => Problem::new(
                "endpoint-limit-exceeded",
                "The tenant has the most callback endpoints it may have",
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .detail(e.to_string()),
            Self::Subject(SubjectError::Reason(e)) => Problem::invalid_request(e.to_string()),
            Self::Subject(SubjectError::InProgress) => in_progress(),
            Self::Subject(SubjectError::KeyReused) => key_reused("way back"),
            Self::Subject(SubjectError::Store(e)) if e.is_transient() => Problem::unavailable(),
            Self::Resolve(ResolveError::Reason(e)) => Problem::invalid_request(e.to_string()),
            Self::Resolve(ResolveError::NotFound) => Problem::not_found(),
            Self::Resolve(e @ ResolveError::NotUnknown(_)) => Problem::new(
                "delivery-not-unknown",
                "Only an action request whose outcome is unknown can be resolved",
                StatusCode::CONFLICT,
            )
            .detail(e.to_string()),
            Self::Resolve(ResolveError::Store(e)) if e.is_transient() => Problem::unavailable(),
            Self::Tenant(TenantError::Store(e)) if e.is_transient() => Problem::unavailable(),
            Self::Tenant(e @ TenantError::TooManyKeys) => Problem::new(
                "quota-exceeded",
                "The tenant has the most live API keys it may have",
                StatusCode::UNPROCESSABLE_ENTITY,
            )
            .detail(e.to_string()),
            Self::NotFound
            | Self::Tenant(TenantError::NotFound(_) | TenantError::KeyNotFound { .. }) => {
                Problem::not_found()
            }
            Self::Invalid(detail) => Problem::invalid_request(detail.clone()),
            Self::Conflict(problem) => problem.clone(),
            Self::Ingest(IngestError::Store(_))
            | Self::Store(_)
            | Self::Tenant(_)
            | Self::Playbook(PlaybookStoreError::Store(_))
            | Self::Simulation(_)
            | Self::Connector(_)
            | Self::Endpoint(_)
            | Self::Subject(_)
            | Self::Resolve(_)
            | Self::Extraction(_) => Problem::internal(),
        }
    }
}

/// 409: a request with the same `Idempotency-Key` is being processed.
fn in_progress() -> Problem {
    Problem::new(
        "request-in-progress",
        "A request with this Idempotency-Key is in progress",
        StatusCode::CONFLICT,
    )
    .detail("Retry after the Retry-After interval to get its result.")
    .retry_after(2)
}

/// 422: the `Idempotency-Key` was used with another body; each distinct `what` needs its own.
fn key_reused(what: &str) -> Problem {
    Problem::new(
        "idempotency-key-reused",
        "This Idempotency-Key was used with a different payload",
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .detail(format!(
        "Each distinct {what} needs its own key; a retry must send the same payload."
    ))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        if problem.status == 503 {
            // Transient: the client retries with the same key. An outage would otherwise log
            // one error per request; the store and the worker say once that it is down.
            tracing::warn!(error = ?self, "request failed transiently");
        } else if problem.status >= 500 {
            tracing::error!(error = ?self, "request failed");
        } else {
            tracing::info!(problem = %problem.type_uri, "request refused");
        }
        problem.into_response()
    }
}
