//! The tenant's own systems, as connector tests meet them: an HTTP endpoint that honours
//! `Idempotency-Key` (applies each key's effect once, answers a repeat without applying it)
//! and counts the effects it applied, and a real SCIM service provider, `scim2-server` (PyPI),
//! run as a process of its own.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

/// One request the endpoint got.
#[derive(Clone, Debug)]
pub struct Call {
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Call {
    /// A header's value.
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct Books {
    calls: Vec<Call>,
    /// Effects applied, by idempotency key: one each, however often a key is sent.
    applied: HashMap<String, usize>,
    /// Answer with this status instead of 204 (after applying nothing).
    refuse_with: Option<u16>,
}

/// An HTTP connector's endpoint on 127.0.0.1 that deduplicates on `Idempotency-Key`; stops when
/// dropped.
pub struct EffectReceiver {
    pub url: String,
    books: Arc<Mutex<Books>>,
    task: tokio::task::JoinHandle<()>,
}

impl EffectReceiver {
    /// Starts it; each new key's effect is applied at once, and the answer comes `delay` later
    /// (long enough for a crash to meet the call in flight).
    pub async fn start(delay: Duration) -> EffectReceiver {
        let books = Arc::new(Mutex::new(Books::default()));
        let state = books.clone();
        let app = axum::Router::new().route(
            "/actions",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let state = state.clone();
                async move {
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let refused = {
                        let mut books = state.lock().unwrap();
                        books.calls.push(Call {
                            headers,
                            body: body.to_vec(),
                        });
                        match books.refuse_with {
                            Some(status) => Some(status),
                            // A key seen before is answered, not applied again.
                            None => {
                                books.applied.entry(key).or_insert(1);
                                None
                            }
                        }
                    };
                    tokio::time::sleep(delay).await;
                    match refused {
                        Some(status) => StatusCode::from_u16(status).unwrap(),
                        None => StatusCode::NO_CONTENT,
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/actions", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        EffectReceiver { url, books, task }
    }

    /// Answers every later request with `status`, applying nothing.
    pub fn refuse_with(&self, status: u16) {
        self.books.lock().unwrap().refuse_with = Some(status);
    }

    /// Every request it got.
    pub fn calls(&self) -> Vec<Call> {
        self.books.lock().unwrap().calls.clone()
    }

    /// The effects applied, one per key: a second effect for one (event, action) would come
    /// under a second key.
    pub fn applied(&self) -> HashMap<String, usize> {
        self.books.lock().unwrap().applied.clone()
    }
}

impl Drop for EffectReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bearer token the tests' SCIM servers take.
pub const SCIM_TOKEN: &str = "scim-test-token-8c1f4e";

/// A `scim2-server` process on a free port of 127.0.0.1, killed on drop.
pub struct ScimServer {
    pub base: String,
    child: Child,
    client: reqwest::Client,
}

impl ScimServer {
    /// Starts one and waits until it answers.
    pub async fn start() -> ScimServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("scim2-server")
            .args([
                "--hostname",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--bearer-token",
                SCIM_TOKEN,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("scim2-server (PyPI) must be installed: scripts/test installs it");
        let server = ScimServer {
            base: format!("http://127.0.0.1:{port}"),
            child,
            client: reqwest::Client::new(),
        };
        let started = Instant::now();
        loop {
            let up = server
                .client
                .get(format!("{}/ServiceProviderConfig", server.base))
                .bearer_auth(SCIM_TOKEN)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return server;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "scim2-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates an active user; returns its id.
    pub async fn create_user(&self, user_name: &str, external_id: &str, active: bool) -> String {
        let created: Value = self
            .client
            .post(format!("{}/Users", self.base))
            .bearer_auth(SCIM_TOKEN)
            .header("content-type", "application/scim+json")
            .body(
                json!({
                    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
                    "userName": user_name,
                    "externalId": external_id,
                    "active": active,
                })
                .to_string(),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        created["id"].as_str().unwrap().to_owned()
    }

    /// A user as the server holds it.
    pub async fn user(&self, id: &str) -> Value {
        self.client
            .get(format!("{}/Users/{id}", self.base))
            .bearer_auth(SCIM_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Registers this server as the tenant's SCIM connector `name`, with the real CLI.
    pub fn register(&self, db: &super::TestDb, tenant: &super::Tenant, name: &str) {
        let token = db.dir().join(format!("scim-token-{name}"));
        std::fs::write(&token, SCIM_TOKEN).unwrap();
        db.cli(&[
            "connector",
            "set",
            "--tenant",
            &tenant.id,
            "--json",
            "--name",
            name,
            "--kind",
            "scim",
            "--url",
            &self.base,
            "--token-file",
            token.to_str().unwrap(),
        ]);
    }

    /// The user's `meta.version`: the server's write counter when it last wrote the user, so
    /// an unchanged version means the user was not written since.
    pub async fn version(&self, id: &str) -> String {
        let user = self.user(id).await;
        user["meta"]["version"]
            .as_str()
            .unwrap_or_else(|| panic!("no version in {user}"))
            .to_owned()
    }
}

impl Drop for ScimServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
