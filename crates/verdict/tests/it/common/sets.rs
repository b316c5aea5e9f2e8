//! A Security Event Token transmitter for tests: keys made and tokens signed by PyJWT with
//! `cryptography` (`set_signer.py`), an independent JOSE implementation, and a JWKS served on
//! 127.0.0.1 that a test can change and count fetches of.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::{Reply, Server, Tenant, TestDb};

/// The issuer test transmitters use.
pub const ISSUER: &str = "https://idp.example.com";
/// The audience test transmitters address.
pub const AUDIENCE: &str = "https://verdict.example.com/receiver";
/// RISC credential compromise: `credential_breach` without any mapping.
pub const CREDENTIAL_COMPROMISE: &str =
    "https://schemas.openid.net/secevent/risc/event-type/credential-compromise";
/// A CAEP event type no mapping names by default.
pub const SESSION_REVOKED: &str =
    "https://schemas.openid.net/secevent/caep/event-type/session-revoked";

fn signer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/common/set_signer.py")
}

/// A transmitter's keys: RSA `rsa-1` and EC P-256 `ec-1`.
pub struct Transmitter {
    dir: PathBuf,
    /// Its public JWKS.
    pub jwks: Value,
}

impl Transmitter {
    /// Fresh keys in `dir`.
    pub fn new(dir: &Path) -> Transmitter {
        let dir = dir.join(format!("transmitter-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("python3")
            .arg(signer())
            .arg("keys")
            .arg(&dir)
            .output()
            .expect("python3 is needed to make test SETs");
        assert!(
            out.status.success(),
            "set_signer.py keys failed (run `pip install pyjwt cryptography`): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let jwks = serde_json::from_slice(&out.stdout).unwrap();
        Transmitter { dir, jwks }
    }

    /// The JWKS with only the keys named.
    pub fn jwks_of(&self, kids: &[&str]) -> Value {
        let keys: Vec<Value> = self.jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| kids.contains(&k["kid"].as_str().unwrap()))
            .cloned()
            .collect();
        json!({ "keys": keys })
    }

    /// Writes the JWKS (only the keys named) to a file; returns its path.
    pub fn jwks_file(&self, kids: &[&str]) -> String {
        let path = self.dir.join(format!("jwks-{}.json", uuid::Uuid::new_v4()));
        std::fs::write(&path, self.jwks_of(kids).to_string()).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// The path of a key's private PEM, to sign with it under another `kid`.
    pub fn private_pem(&self, kid: &str) -> String {
        self.dir
            .join(format!("{kid}.pem"))
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The path of a key's public PEM (for the HMAC-with-a-public-key trick).
    pub fn public_pem(&self, kid: &str) -> String {
        self.dir
            .join(format!("{kid}.pub.pem"))
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// Signs `claims` with key `kid` (`rsa-1` signs RS256, `ec-1` ES256).
    pub fn sign(&self, kid: &str, claims: &Value) -> String {
        let alg = if kid.starts_with("ec") {
            "ES256"
        } else {
            "RS256"
        };
        self.sign_with(json!({"kid": kid, "alg": alg, "claims": claims}))
    }

    /// Signs as `request` says (see `set_signer.py`); `pem` defaults to the `kid`'s key.
    pub fn sign_with(&self, mut request: Value) -> String {
        if request.get("pem").is_none()
            && let Some(kid) = request["kid"].as_str()
        {
            request["pem"] = json!(self.dir.join(format!("{kid}.pem")));
        }
        let mut child = Command::new("python3")
            .arg(signer())
            .arg("sign")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 is needed to make test SETs");
        {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(request.to_string().as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "set_signer.py sign failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

/// A fresh SET's claims: issued now by [`ISSUER`] for [`AUDIENCE`], a random `jti`, one
/// event of `event_type` about `sub_id`.
pub fn claims(event_type: &str, sub_id: Value) -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": super::now(),
        "jti": uuid::Uuid::new_v4().simple().to_string(),
        "sub_id": sub_id,
        "events": { event_type: {} },
    })
}

/// An email subject (RFC 9493).
pub fn email(address: &str) -> Value {
    json!({"format": "email", "email": address})
}

/// A phone subject (RFC 9493).
pub fn phone(number: &str) -> Value {
    json!({"format": "phone_number", "phone_number": number})
}

/// Registers the transmitter with the real CLI: its keys as a file of the keys named.
pub fn register_file(db: &TestDb, tenant: &Tenant, transmitter: &Transmitter, kids: &[&str]) {
    db.cli(&[
        "tenant",
        "set-transmitter",
        "--tenant",
        &tenant.id,
        "--issuer",
        ISSUER,
        "--audience",
        AUDIENCE,
        "--jwks-file",
        &transmitter.jwks_file(kids),
    ]);
}

/// Pushes a SET as RFC 8935 does, with `api_key`.
pub async fn push(server: &Server, api_key: &str, token: &str) -> Reply {
    push_as(server, api_key, "application/secevent+jwt", token).await
}

/// Pushes a body with a given content type.
pub async fn push_as(server: &Server, api_key: &str, content_type: &str, body: &str) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}/v1/sets", server.base))
            .bearer_auth(api_key)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A JWKS served on 127.0.0.1, which a test may replace, counting fetches.
pub struct JwksServer {
    pub url: String,
    jwks: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    /// Serves `jwks` at `/jwks.json`.
    pub async fn start(jwks: Value) -> JwksServer {
        let jwks = Arc::new(Mutex::new(jwks));
        let fetches = Arc::new(AtomicUsize::new(0));
        let app = {
            let (jwks, fetches) = (jwks.clone(), fetches.clone());
            axum::Router::new().route(
                "/jwks.json",
                axum::routing::get(move || {
                    let (jwks, fetches) = (jwks.clone(), fetches.clone());
                    async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        axum::Json(jwks.lock().unwrap().clone())
                    }
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        JwksServer {
            url,
            jwks,
            fetches,
            task,
        }
    }

    /// Serves `jwks` from now on.
    pub fn replace(&self, jwks: Value) {
        *self.jwks.lock().unwrap() = jwks;
    }

    /// How many times it was fetched.
    pub fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
