//! A real HTTP receiver on 127.0.0.1 for callback tests: answers from a script, then 200, and
//! records every request it gets.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

/// One scripted answer.
#[derive(Clone, Debug)]
pub struct Step {
    pub status: u16,
    pub delay: Duration,
    pub headers: Vec<(&'static str, String)>,
}

impl Step {
    /// Answer `status` at once.
    pub fn status(status: u16) -> Step {
        Step {
            status,
            delay: Duration::ZERO,
            headers: Vec::new(),
        }
    }

    /// Answer `status` after `delay`.
    pub fn slow(status: u16, delay: Duration) -> Step {
        Step {
            delay,
            ..Step::status(status)
        }
    }

    /// Adds a response header.
    pub fn header(mut self, name: &'static str, value: &str) -> Step {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// A request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Received {
    /// A header's value.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct State {
    script: Vec<Step>,
    default: Option<Step>,
    received: Vec<Received>,
}

/// The running receiver; stops when dropped.
pub struct Receiver {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts a receiver that answers `script` in order, then 200.
    pub async fn start(script: Vec<Step>) -> Receiver {
        let state = Arc::new(Mutex::new(State {
            script: script.into_iter().rev().collect(),
            ..State::default()
        }));
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let shared = shared.clone();
                async move {
                    let step = {
                        let mut s = shared.lock().unwrap();
                        s.received.push(Received {
                            path: uri.path().to_owned(),
                            headers,
                            body: body.to_vec(),
                        });
                        let default = s.default.clone();
                        s.script
                            .pop()
                            .or(default)
                            .unwrap_or_else(|| Step::status(200))
                    };
                    tokio::time::sleep(step.delay).await;
                    let mut response = StatusCode::from_u16(step.status).unwrap().into_response();
                    for (name, value) in step.headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    response
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver { url, state, task }
    }

    /// Answers every request after the script with `step` instead of 200.
    pub fn answer_by_default(&self, step: Step) {
        self.state.lock().unwrap().default = Some(step);
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Verifies every received request with the reference Python `standardwebhooks` library.
    pub fn verify_all_with_python(&self, whsec: &str) {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let requests: Vec<serde_json::Value> = self
            .received()
            .iter()
            .map(|r| {
                serde_json::json!({
                    "body": b64.encode(&r.body),
                    "id": r.header("webhook-id"),
                    "timestamp": r.header("webhook-timestamp"),
                    "signature": r.header("webhook-signature"),
                })
            })
            .collect();
        assert!(!requests.is_empty(), "nothing was received to verify");
        let script = r#"
import base64, json, sys
from standardwebhooks.webhooks import Webhook
data = json.load(sys.stdin)
wh = Webhook(data["secret"])
for r in data["requests"]:
    wh.verify(base64.b64decode(r["body"]), {
        "webhook-id": r["id"], "webhook-timestamp": r["timestamp"], "webhook-signature": r["signature"],
    })
print(len(data["requests"]))
"#;
        let mut child = std::process::Command::new("python3")
            .args(["-c", script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 is needed for the reference check");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(
                serde_json::json!({"secret": whsec, "requests": requests})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the reference library refused a delivery (run `pip install standardwebhooks` if it is missing): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            requests.len().to_string()
        );
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
