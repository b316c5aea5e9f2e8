//! The one test helper module: a real HTTP server on 127.0.0.1 that answers from a script and
//! remembers every request it saw, optionally dropping the first connection unanswered.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpListener, TcpStream};
use verdict_client::Client;

/// A request as the server received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub at: Instant,
}

impl Seen {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("request had no {name} header"))
            .to_str()
            .expect("text header")
    }
}

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, &'static str)>,
    pub body: &'static str,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: "",
        }
    }

    pub fn json(status: u16, body: &'static str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", "application/json")],
            body,
        }
    }

    pub fn header(mut self, name: &'static str, value: &'static str) -> Reply {
        self.headers.push((name, value));
        self
    }
}

/// What the server answers once its script is used up.
pub const DECISION: &str = r#"{"event_id":"evt_1","decision":"deny"}"#;

#[derive(Clone, Default)]
struct Shared {
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

/// A scripted server on a real socket.
pub struct TestServer {
    pub url: String,
    shared: Shared,
}

impl TestServer {
    /// Answers with `script`, in order, then 200 with [`DECISION`].
    pub async fn start(script: Vec<Reply>) -> TestServer {
        TestServer::launch(script, false).await
    }

    /// Reads the first request in full, closes the connection without answering, then serves `script`.
    pub async fn start_dropping_first(script: Vec<Reply>) -> TestServer {
        TestServer::launch(script, true).await
    }

    async fn launch(script: Vec<Reply>, drop_first: bool) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let shared = Shared {
            seen: Arc::default(),
            script: Arc::new(Mutex::new(script.into())),
        };
        let app = axum::Router::new()
            .route("/v1/signals", axum::routing::post(answer))
            .with_state(shared.clone());
        let seen = Arc::clone(&shared.seen);
        tokio::spawn(async move {
            if drop_first {
                let (stream, _) = listener.accept().await.expect("accept");
                let request = read_request(stream).await;
                seen.lock().expect("seen lock").push(request);
                // The stream is dropped here: the client gets no response at all.
            }
            axum::serve(listener, app).await
        });
        TestServer { url, shared }
    }

    /// Every request seen so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("seen lock").clone()
    }
}

async fn answer(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    shared.seen.lock().expect("seen lock").push(Seen {
        headers,
        body: body.to_vec(),
        at: Instant::now(),
    });
    let reply = shared.script.lock().expect("script lock").pop_front();
    let reply = reply.unwrap_or(Reply::json(200, DECISION));
    let mut headers = HeaderMap::new();
    for (name, value) in reply.headers {
        headers.insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }
    let status = StatusCode::from_u16(reply.status).expect("valid status");
    (status, headers, reply.body).into_response()
}

/// Reads one HTTP/1.1 request (headers, then a Content-Length body) off a raw connection.
async fn read_request(mut stream: TcpStream) -> Seen {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed before the request head");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = std::str::from_utf8(&buf[..head_end]).expect("ascii head");
    let mut headers = HeaderMap::new();
    for line in head.split("\r\n").skip(1).filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("header line");
        headers.append(
            HeaderName::from_bytes(name.trim().as_bytes()).expect("header name"),
            HeaderValue::from_str(value.trim()).expect("header value"),
        );
    }
    let length: usize = headers
        .get("content-length")
        .map(|v| v.to_str().expect("length").parse().expect("length"))
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed before the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    Seen {
        headers,
        body: buf[head_end..head_end + length].to_vec(),
        at: Instant::now(),
    }
}

/// A client with test-sized backoff, so retries take milliseconds.
pub fn client(url: &str) -> verdict_client::ClientBuilder {
    Client::builder(url, "vk_test_key").backoff(Duration::from_millis(5), Duration::from_millis(20))
}
