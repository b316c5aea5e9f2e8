//! The HTTP API: routes, shared state, and the layers every request passes through.

mod auth;
mod body;
pub mod connections;
mod deliveries;
pub mod error;
mod events;
mod extract;
mod feeds;
mod keys;
mod openapi;
mod playbook;
pub mod problem;
mod signals;

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use crate::delivery::Deliverer;
use crate::feeds::set::SetReceiver;
use crate::ingest::Ingest;
use crate::rate_limit::RateLimits;
use crate::secrets::Keyring;
use crate::store::Store;
use crate::tenant::Credentials;

pub use keys::KeyView;
pub use signals::MAX_BODY_BYTES;

/// What handlers share, behind one `Arc`: axum clones the state for every request (and its
/// middleware), and one reference count is cheaper to move than eight.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// Shares `shared` with every handler.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
pub struct Shared {
    pub store: Arc<dyn Store>,
    pub keys: Arc<Keyring>,
    pub ingest: Arc<Ingest>,
    pub deliverer: Arc<Deliverer>,
    /// What API keys grant and tenants' secrets, cached for at most 5 s.
    pub credentials: Arc<Credentials>,
    /// Each tenant's rate limiter.
    pub rate_limits: Arc<RateLimits>,
    /// Verifies Security Event Tokens against each tenant's transmitter.
    pub sets: Arc<SetReceiver>,
    pub metrics: Option<PrometheusHandle>,
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/signals", post(signals::post_signal))
        .route("/v1/sets", post(feeds::post_set))
        .route("/v1/camara/sim-swap", post(feeds::post_camara_sim_swap))
        .route("/v1/events", get(events::list))
        .route("/v1/events/{id}", get(events::show))
        .route("/v1/subjects/{subject_hash}", get(events::subject))
        .route("/v1/deliveries", get(deliveries::list))
        .route("/v1/deliveries/{id}", get(deliveries::show))
        .route("/v1/deliveries/{id}/redeliver", post(deliveries::redeliver))
        .route("/v1/playbook", get(playbook::show).put(playbook::replace))
        .route("/v1/playbook/simulate", post(playbook::simulate))
        .route("/v1/keys", get(keys::list).post(keys::create))
        .route("/v1/keys/{key_id}", delete(keys::revoke))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::document))
        .nest("/console", crate::console::router())
        .route(
            "/console/",
            get(|| async { axum::response::Redirect::to("/console/events") }),
        )
        .fallback(|| async { problem::Problem::not_found() })
        .method_not_allowed_fallback(|| async { problem::Problem::method_not_allowed() })
        .route_layer(axum::middleware::from_fn(record_latency))
        .with_state(state)
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::middleware::map_request(keep_safe_request_id))
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(
                    // The span carries the request id; it deliberately records no headers or
                    // query, which could hold keys or identifiers.
                    TraceLayer::new_for_http()
                        .make_span_with(|req: &Request<_>| {
                            let id = req
                                .headers()
                                .get(REQUEST_ID)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-");
                            tracing::info_span!(
                                "request",
                                request_id = %id,
                                method = %req.method(),
                                path = %logged_path(req.uri().path()),
                            )
                        })
                        .on_response(DefaultOnResponse::new().level(Level::INFO)),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
}

/// Longest request path a log line carries: a client may send paths of tens of KiB, and every
/// line of the request repeats it.
const MAX_LOGGED_PATH: usize = 256;

/// The request's path as logged: cut at [`MAX_LOGGED_PATH`] bytes (on a character boundary),
/// marked with `…` where it was cut.
fn logged_path(path: &str) -> std::borrow::Cow<'_, str> {
    if path.len() <= MAX_LOGGED_PATH {
        return path.into();
    }
    let mut end = MAX_LOGGED_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end]).into()
}

/// Longest client-sent request id kept.
const MAX_REQUEST_ID_LEN: usize = 64;

/// Drops a client's `x-request-id` unless it is short and made of safe characters, so a fresh
/// one is made: the id goes into every log line of the request and into callbacks' logs.
async fn keep_safe_request_id(mut req: Request<axum::body::Body>) -> Request<axum::body::Body> {
    let safe = req.headers().get(REQUEST_ID).is_none_or(|id| {
        let id = id.as_bytes();
        (1..=MAX_REQUEST_ID_LEN).contains(&id.len())
            && id
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
    });
    if !safe {
        req.headers_mut().remove(REQUEST_ID);
    }
    req
}

/// Records each request's latency by route and status class.
async fn record_latency(
    route: Option<axum::extract::MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    let route = route.map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let status = match response.status().as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    };
    metrics::histogram!("verdict_http_request_duration_seconds", "route" => route, "status" => status)
        .record(started.elapsed().as_secs_f64());
    response
}

/// `GET /healthz`: the process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations", security(()),
    responses((status = 200, body = String, content_type = "text/plain", description = "Up")))]
async fn healthz() -> &'static str {
    "ok"
}

/// `GET /readyz`: the database answers.
#[utoipa::path(get, path = "/readyz", operation_id = "readyz", tag = "operations", security(()),
    responses((status = 200, body = String, content_type = "text/plain", description = "Ready"),
        (status = 503, body = problem::Problem, description = "The database is unreachable")))]
async fn readyz(State(app): State<AppState>) -> Response {
    match app.store.ping().await {
        Ok(()) => "ready".into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "readiness check failed");
            problem::Problem::unavailable()
                .detail("The database is unreachable.")
                .into_response()
        }
    }
}

/// `GET /metrics`: Prometheus metrics.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations", security(()),
    responses((status = 200, body = String, content_type = "text/plain; version=0.0.4", description = "Prometheus text format"),
        (status = 404, body = problem::Problem, description = "Metrics are not recorded by this process")))]
async fn metrics(State(app): State<AppState>) -> Response {
    match &app.metrics {
        Some(handle) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => problem::Problem::not_found().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_path_is_logged_cut_at_a_character_boundary() {
        assert_eq!(logged_path("/v1/events"), "/v1/events");
        let long = format!("/{}", "é".repeat(400));
        let logged = logged_path(&long);
        assert!(
            logged.len() <= MAX_LOGGED_PATH + '…'.len_utf8(),
            "{}",
            logged.len()
        );
        assert!(logged.ends_with('…'));
        assert!(long.starts_with(logged.trim_end_matches('…')));
    }
}
