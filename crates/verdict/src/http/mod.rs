//! The HTTP API: its routes and handlers.

mod auth;
mod body;
mod connectors;
mod deliveries;
mod endpoints;
mod events;
mod extract;
mod feeds;
mod keys;
mod openapi;
mod playbook;
mod signals;
mod signature;
mod subjects;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};

use crate::app::AppState;
use crate::problem::Problem;

pub use deliveries::DeliveryDetail;
pub use events::DeliveryView;
pub use keys::KeyView;
pub use signals::MAX_BODY_BYTES;

/// The API's routes; `server.rs` mounts them with the console's and layers them.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/signals", post(signals::post_signal))
        .route("/v1/sets", post(feeds::post_set))
        .route("/v1/camara/sim-swap", post(feeds::post_camara_sim_swap))
        .route("/v1/events", get(events::list))
        .route("/v1/events/{id}", get(events::show))
        .route("/v1/subjects/{subject_hash}", get(events::subject))
        .route("/v1/subjects/lookup", post(subjects::lookup))
        .route("/v1/subjects/unlock", post(subjects::unlock))
        .route("/v1/subjects/lift-deny", post(subjects::lift_deny))
        .route("/v1/subjects/close-case", post(subjects::close_case))
        .route("/v1/deliveries", get(deliveries::list))
        .route("/v1/deliveries/{id}", get(deliveries::show))
        .route("/v1/deliveries/{id}/redeliver", post(deliveries::redeliver))
        .route("/v1/deliveries/{id}/resolve", post(deliveries::resolve))
        .route("/v1/playbook", get(playbook::show).put(playbook::replace))
        .route("/v1/playbook/simulate", post(playbook::simulate))
        .route("/v1/keys", get(keys::list).post(keys::create))
        .route("/v1/keys/{key_id}", delete(keys::revoke))
        .route("/v1/connectors", get(connectors::list))
        .route(
            "/v1/connectors/{name}",
            get(connectors::show)
                .put(connectors::set)
                .delete(connectors::delete),
        )
        .route("/v1/endpoints", get(endpoints::list))
        .route(
            "/v1/endpoints/{name}",
            get(endpoints::show)
                .put(endpoints::set)
                .delete(endpoints::delete),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi::document))
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
        (status = 503, body = Problem, description = "The database is unreachable")))]
async fn readyz(State(app): State<AppState>) -> Response {
    match app.store.ping().await {
        Ok(()) => "ready".into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "readiness check failed");
            Problem::unavailable()
                .detail("The database is unreachable.")
                .into_response()
        }
    }
}

/// `GET /metrics`: Prometheus metrics; with `VERDICT_METRICS_TOKEN` set, only for a request
/// bearing that token.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "operations", security(()),
    responses((status = 200, body = String, content_type = "text/plain; version=0.0.4", description = "Prometheus text format"),
        (status = 401, body = Problem, description = "`VERDICT_METRICS_TOKEN` is set and the request does not bear it"),
        (status = 404, body = Problem, description = "Metrics are not recorded by this process")))]
async fn metrics(State(app): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if let Some(token) = &app.metrics_token {
        let presented = auth::bearer(&headers).unwrap_or("");
        if !token.matches(presented) {
            return Problem::unauthorized(
                "invalid-metrics-token",
                "GET /metrics needs the bearer token VERDICT_METRICS_TOKEN names.",
            )
            .into_response();
        }
    }
    match &app.metrics {
        Some(handle) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => Problem::not_found().into_response(),
    }
}
