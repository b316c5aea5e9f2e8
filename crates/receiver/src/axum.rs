//! The receiver as an axum endpoint: the whole checklist in one line of routing.
//!
//! ```no_run
//! use verdict_receiver::{Event, Receiver, SqliteDedupStore};
//! use verdict_webhooks::Secret;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteDedupStore::open("received-webhooks.db").await?;
//! let receiver = Receiver::builder(store)
//!     .secret(Secret::parse(&std::env::var("VERDICT_WEBHOOK_SECRET")?)?)
//!     .build()?;
//! let app = axum::Router::new().route(
//!     "/webhooks/verdict",
//!     verdict_receiver::axum::endpoint(receiver, |event: Event| async move {
//!         println!("{} for {}", event.envelope.decision, event.envelope.subject_hash);
//!         Ok::<_, std::convert::Infallible>(())
//!     }),
//! );
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(())
//! # }
//! ```
//!
//! Answers: 204 for a new event (the handler runs after the answer) and for a discarded
//! duplicate; 401 for a missing, wrong or stale signature, or more than
//! [`MAX_SIGNATURES`](verdict_webhooks::MAX_SIGNATURES) of them; 400 for a body that is not an
//! envelope; 413 for a body over the size limit (1 MiB by default); 503 when the store is
//! unreachable, so that verdict retries.

use std::sync::{Arc, Weak};

use ::axum::Router;
use ::axum::body::Bytes;
use ::axum::extract::DefaultBodyLimit;
use ::axum::extract::rejection::BytesRejection;
use ::axum::http::{HeaderMap, StatusCode};
use ::axum::response::{IntoResponse, Response};
use ::axum::routing::{MethodRouter, post};

use crate::receiver::unix_now_ms;
use crate::{Handler, ReceiveError, Received, Receiver};

struct State<H> {
    receiver: Receiver,
    handler: H,
}

/// A router answering `POST /`; nest it, or use [`endpoint`] to mount at your own path.
pub fn router<H: Handler>(receiver: Receiver, handler: H) -> Router {
    Router::new().route("/", endpoint(receiver, handler))
}

/// A `POST` endpoint that receives verdict callbacks and hands each new event to `handler`.
///
/// When created inside a Tokio runtime it also starts the recovery pass: once at once, then every
/// [`recovery_interval`](crate::ReceiverBuilder::recovery_interval), until the endpoint is dropped.
///
/// Bodies are read up to the receiver's [`max_body_bytes`](crate::ReceiverBuilder::max_body_bytes)
/// and no further: a larger one is answered 413 without being buffered whole.
pub fn endpoint<H: Handler>(receiver: Receiver, handler: H) -> MethodRouter {
    let limit = receiver.max_body_bytes();
    let state = Arc::new(State { receiver, handler });
    spawn_recovery(Arc::downgrade(&state));
    post(
        move |headers: HeaderMap, body: Result<Bytes, BytesRejection>| {
            let state = Arc::clone(&state);
            async move {
                match body {
                    Ok(body) => receive(state, headers, body).await,
                    Err(rejection) => refuse_body(&rejection),
                }
            }
        },
    )
    .layer(DefaultBodyLimit::max(limit))
}

/// A body that could not be read: over the limit (413), or cut off (400).
fn refuse_body(rejection: &BytesRejection) -> Response {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        tracing::info!("webhook refused: body over the size limit");
        (StatusCode::PAYLOAD_TOO_LARGE, "webhook body too large").into_response()
    } else {
        tracing::info!(error = %rejection, "webhook refused: body unreadable");
        (StatusCode::BAD_REQUEST, "unreadable webhook body").into_response()
    }
}

async fn receive<H: Handler>(state: Arc<State<H>>, headers: HeaderMap, body: Bytes) -> Response {
    let now_secs = unix_now_ms() / 1000;
    match state.receiver.receive(&headers, &body, now_secs).await {
        Ok(Received::New(event)) => {
            // After the answer: a slow handler must not hold the sender past its deadline.
            tokio::spawn(async move {
                if let Err(e) = state.receiver.process(event, &state.handler).await {
                    tracing::warn!(error = %e, "event left pending for recovery");
                }
            });
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(Received::Duplicate) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => {
            let (status, text) = status_of(&e);
            if status.is_server_error() {
                tracing::error!(error = %e, "webhook not recorded");
            } else {
                tracing::info!(error = %e, "webhook refused");
            }
            (status, text).into_response()
        }
    }
}

/// The one place errors become HTTP answers; texts are short and reveal nothing.
fn status_of(err: &ReceiveError) -> (StatusCode, &'static str) {
    match err {
        ReceiveError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "invalid webhook signature"),
        ReceiveError::Stale(_) => (
            StatusCode::UNAUTHORIZED,
            "webhook timestamp outside tolerance",
        ),
        ReceiveError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "webhook body too large"),
        ReceiveError::NotAnEnvelope { .. } => {
            (StatusCode::BAD_REQUEST, "body is not a verdict envelope")
        }
        ReceiveError::Store(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "temporarily unable to record webhook",
        ),
        ReceiveError::Handler(_) | ReceiveError::Config(_) => {
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

/// Runs recovery passes while the endpoint lives; a no-op outside a Tokio runtime.
fn spawn_recovery<H: Handler>(state: Weak<State<H>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("no Tokio runtime: call Receiver::recover yourself");
        return;
    };
    let Some(interval) = state.upgrade().map(|s| s.receiver.recovery_interval()) else {
        return;
    };
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            // Holding only a weak reference lets the task end with the endpoint.
            let Some(state) = state.upgrade() else { return };
            let now_secs = unix_now_ms() / 1000;
            match state.receiver.recover(&state.handler, now_secs).await {
                Ok(r) if r.handled + r.failed > 0 => {
                    tracing::info!(handled = r.handled, failed = r.failed, "recovered events");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "recovery pass failed"),
            }
        }
    });
}
