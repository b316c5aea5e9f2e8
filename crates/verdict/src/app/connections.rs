//! Accepting connections under explicit bounds: how many at once, how long a client may take
//! to send its headers and its body, and how long one request may run. `axum::serve` offers
//! none of these (it sets no timer, so hyper's header timeout never fires).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::problem::Problem;

/// Bounds on what clients can hold open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundLimits {
    /// A client must send a request's whole header within this time, including the first
    /// request on a new connection and the next one on a kept-alive connection.
    pub header_timeout: Duration,
    /// A client must send a request's whole body within this time from its headers, however
    /// steadily the bytes come.
    pub body_timeout: Duration,
    /// A request is answered (503, retry with the same key) if it is not done by then.
    pub request_timeout: Duration,
    /// Connections held at once; past it, new ones wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for InboundLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            max_connections: 1024,
        }
    }
}

/// Serves `app` on `listener` until `stop`, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: InboundLimits,
    stop: CancellationToken,
) {
    let app = app
        .layer(axum::middleware::from_fn_with_state(
            limits.request_timeout,
            request_deadline,
        ))
        .layer(axum::middleware::map_request_with_state(
            limits.body_timeout,
            |State(within): State<Duration>, req: Request| async move {
                super::body_deadline::bound_body(req, within)
            },
        ));
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, most likely: back off instead of spinning.
                    tracing::warn!(error = ?err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = ?err, "could not set TCP_NODELAY");
        }
        // The client's address, for what is counted per client (the console's sign-in).
        let service = TowerToHyperService::new(app.clone().map_request(
            move |mut req: Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req
            },
        ));
        let stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                () = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(err) = ended {
                tracing::debug!(error = ?err, "connection closed with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// Answers 503 when a request outlives its deadline. A signal cut off this way is like one
/// whose process died: its key stays claimed until the lock times out, then a retry resumes.
async fn request_deadline(State(deadline): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(deadline, next.run(req)).await {
        Ok(response) => response,
        Err(_elapsed) => {
            metrics::counter!("verdict_request_deadline_exceeded_total").increment(1);
            tracing::warn!(
                deadline_ms = deadline.as_millis() as u64,
                "request ran past its deadline"
            );
            Problem::unavailable().into_response()
        }
    }
}
