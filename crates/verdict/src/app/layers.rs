//! The layers every request passes through, whichever edge routes it: the fallbacks, the
//! latency metric, the request id, the request's span and the headers every response carries.

use axum::Router;
use axum::extract::MatchedPath;
use axum::http::{HeaderName, HeaderValue, Request, header};
use axum::response::Response;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, OnResponse, TraceLayer};
use tracing::Level;

use super::AppState;
use crate::problem::Problem;
use crate::telemetry;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `routes` (every edge's, composed) with the fallbacks and the layers every request passes
/// through, served with `state`.
pub fn layered(routes: Router<AppState>, state: AppState) -> Router {
    routes
        .fallback(|| async { Problem::not_found() })
        .method_not_allowed_fallback(|| async { Problem::method_not_allowed() })
        .route_layer(axum::middleware::from_fn(record_latency))
        .layer(axum::middleware::map_response(private_responses))
        .with_state(state)
        .layer(
            tower::ServiceBuilder::new()
                .layer(axum::middleware::map_request(keep_safe_request_id))
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(
                    // The span carries the request id and the route's template; it
                    // deliberately records no headers, query or raw path, any of which could
                    // hold keys or identifiers (a phone number put in a path). With traces on
                    // it is the trace's root (or the caller's span's child), and records the
                    // response's status.
                    TraceLayer::new_for_http()
                        .make_span_with(|req: &Request<_>| {
                            let id = req
                                .headers()
                                .get(REQUEST_ID)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("-");
                            let route = req
                                .extensions()
                                .get::<MatchedPath>()
                                .map_or(UNMATCHED, MatchedPath::as_str);
                            // A signal's event and decision are recorded on it once decided
                            // ([`EVENT_ID_FIELD`], [`DECISION_FIELD`]), for the response's line.
                            let span = tracing::info_span!(
                                "request",
                                request_id = %id,
                                method = %req.method(),
                                route = %logged_path(route),
                                event_id = tracing::field::Empty,
                                decision = tracing::field::Empty,
                            );
                            // The caller's trace goes on here, if it sent a usable one.
                            telemetry::continue_trace(&span, req.headers());
                            span
                        })
                        .on_response(|response: &Response, latency, span: &tracing::Span| {
                            DefaultOnResponse::new()
                                .level(Level::INFO)
                                .on_response(response, latency, span);
                            telemetry::record_response(span, response.status().as_u16());
                        }),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
}

/// The request span's field for the event a signal recorded (the span declares it by name).
pub const EVENT_ID_FIELD: &str = "event_id";
/// The request span's field for a signal's decision.
pub const DECISION_FIELD: &str = "decision";
/// The target of the response's log line (tower-http's `DefaultOnResponse`, at `INFO`): a
/// filter that leaves it out leaves out what the request's span carries with it.
pub const RESPONSE_LOG_TARGET: &str = "tower_http::trace::on_response";

/// What a request that matched no route logs as its route.
const UNMATCHED: &str = "unmatched";

/// Every response: never cached by a browser or proxy (the API's answers are one tenant's
/// data), and never content-sniffed. A response that sets its own caching (the console's
/// stylesheet) keeps it.
async fn private_responses(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// Longest route a log line carries (a route template is short; kept as a guard).
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
    let route = route.map_or_else(|| UNMATCHED.to_owned(), |p| p.as_str().to_owned());
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
