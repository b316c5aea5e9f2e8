//! Accepting connections under explicit bounds: how many at once, and from one client address,
//! how long a client may take to send its headers and its body, and how long one request may
//! run. `axum::serve` offers none of these (it sets no timer, so hyper's header timeout never
//! fires). When the connections held near the cap, idle ones (kept alive between requests,
//! or not yet through their headers) are closed first, so clients holding connections open
//! delay another's request by a moment, not by a timeout.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
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
    /// Connections held at once from one client address; past it, a new one is answered 429
    /// and closed.
    pub max_connections_per_client: usize,
}

impl Default for InboundLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            max_connections: 1024,
            max_connections_per_client: 256,
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
    let clients = Arc::new(PerClient::new(limits.max_connections_per_client));
    let mut shedder = Shedder::new(limits.max_connections);
    let connections = TaskTracker::new();
    loop {
        // At the cap, idle connections are asked to go while the next one waits.
        let permit = loop {
            tokio::select! {
                () = stop.cancelled() => break None,
                permit = permits.clone().acquire_owned() => break permit.ok(),
                () = tokio::time::sleep(Shedder::EVERY) => shedder.shed_if_near_cap(0),
            }
        };
        let Some(permit) = permit else { break };
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
        let Some(slot) = clients.admit(peer.ip()) else {
            refuse_over_client_bound(&stream);
            continue;
        };
        shedder.shed_if_near_cap(permits.available_permits());
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = ?err, "could not set TCP_NODELAY");
        }
        let activity = Arc::new(Activity::new());
        // The client's address, for what is counted per client (the console's sign-in).
        let service = Counted {
            inner: TowerToHyperService::new(app.clone().map_request(
                move |mut req: Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req
                },
            )),
            activity: activity.clone(),
        };
        let (stop, shed) = (stop.clone(), shedder.subscribe());
        connections.spawn(async move {
            let _held = (permit, slot);
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let ended = run_connection(conn, &activity, stop, shed).await;
            if let Err(err) = ended {
                tracing::debug!(error = ?err, "connection closed with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
    // The shedder lives until every connection ended: they watch it.
    drop(shedder);
}

/// Serves one connection until it ends; on `stop` it finishes its request and closes, and on
/// a shed, if it has had no request in progress for [`SHED_AFTER_IDLE`], it closes.
async fn run_connection<S>(
    conn: http1::Connection<TokioIo<TcpStream>, S>,
    activity: &Activity,
    stop: CancellationToken,
    mut shed: watch::Receiver<u64>,
) -> hyper::Result<()>
where
    S: hyper::service::HttpService<hyper::body::Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::ResBody: 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut conn = std::pin::pin!(conn);
    loop {
        tokio::select! {
            ended = conn.as_mut() => return ended,
            () = stop.cancelled() => break,
            changed = shed.changed() => {
                if changed.is_ok() && activity.idle_for().is_some_and(|idle| idle >= SHED_AFTER_IDLE) {
                    metrics::counter!("verdict_connections_shed_total").increment(1);
                    break;
                }
            }
        }
    }
    // Closes at once when idle, else after the request in progress.
    conn.as_mut().graceful_shutdown();
    conn.await
}

/// Connections held per client address, each counted by the [`ClientSlot`] it holds.
struct PerClient {
    max: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl PerClient {
    fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for one more connection from `ip`, if it holds fewer than the bound. The map
    /// holds one entry per address with a connection open, so it is bounded by the
    /// connection cap.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = held.entry(ip).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: self.clone(),
            ip,
        })
    }
}

/// One connection's place in its address's count, given back when dropped.
struct ClientSlot {
    clients: Arc<PerClient>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self
            .clients
            .held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = held.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// What a connection over its address's bound gets before it is closed.
static OVER_CLIENT_BOUND: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = r#"{"type":"https://verdict.dev/problems/too-many-connections","title":"Too many connections from this address","status":429,"detail":"This address holds as many connections as one client may; retry once one closes."}"#;
    format!(
        "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/problem+json\r\n\
         Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Answers a connection over its address's bound without waiting on it (what fits in the
/// socket buffer, which is all of it on a new connection), then closes it.
fn refuse_over_client_bound(stream: &TcpStream) {
    metrics::counter!("verdict_connections_refused_total", "reason" => "per_client").increment(1);
    let _ = stream.try_write(&OVER_CLIENT_BOUND);
}

/// Tells idle connections to close when the connections held near the cap, at most every
/// [`Shedder::EVERY`].
struct Shedder {
    reserve: usize,
    epoch: watch::Sender<u64>,
    last: Option<Instant>,
}

impl Shedder {
    /// How often a shed may be asked for: each wakes every connection.
    const EVERY: Duration = Duration::from_millis(100);

    fn new(max_connections: usize) -> Self {
        Self {
            // An eighth of the cap kept free for clients with work to do.
            reserve: (max_connections / 8).max(1),
            epoch: watch::Sender::new(0),
            last: None,
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    fn shed_if_near_cap(&mut self, free: usize) {
        if free >= self.reserve || self.last.is_some_and(|at| at.elapsed() < Self::EVERY) {
            return;
        }
        self.last = Some(Instant::now());
        self.epoch
            .send_modify(|epoch| *epoch = epoch.wrapping_add(1));
    }
}

/// How long a connection must have had no request in progress before a shed closes it: a
/// new connection gets this long to send its first request's headers.
const SHED_AFTER_IDLE: Duration = Duration::from_millis(250);

/// A connection's requests in progress, and since when it has had none.
struct Activity {
    active: AtomicUsize,
    /// Milliseconds since [`EPOCH`] at which the last request ended (or the connection
    /// opened).
    idle_since: AtomicU64,
}

/// What [`Activity`] measures time from.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

fn since_epoch() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Activity {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            idle_since: AtomicU64::new(since_epoch()),
        }
    }

    /// How long the connection has had no request in progress; `None` while it has one.
    fn idle_for(&self) -> Option<Duration> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.idle_since.load(Ordering::Acquire);
        Some(Duration::from_millis(since_epoch().saturating_sub(since)))
    }
}

/// A connection's service, counting its requests in progress (so a shed can tell an idle
/// connection from a busy one).
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, R> hyper::service::Service<R> for Counted<S>
where
    S: hyper::service::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn call(&self, request: R) -> Self::Future {
        let in_progress = InProgress::start(self.activity.clone());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            drop(in_progress);
            response
        })
    }
}

/// One request in progress on a connection, until dropped.
struct InProgress(Arc<Activity>);

impl InProgress {
    fn start(activity: Arc<Activity>) -> Self {
        activity.active.fetch_add(1, Ordering::AcqRel);
        Self(activity)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.idle_since.store(since_epoch(), Ordering::Release);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
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
