//! The client: one key and one body per signal, sent until verdict answers for good.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use uuid::Uuid;
use verdict_webhooks::Secret;

use crate::ClientError;
use crate::retry::{Backoff, Disposition, parse_retry_after, wait};

/// Header carrying the per-signal idempotency key.
pub const HEADER_IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Header carrying the unix time (seconds) an attempt was signed at.
pub const HEADER_TIMESTAMP: &str = "Verdict-Timestamp";
/// Header carrying `v1,<base64 HMAC-SHA256(secret, "{timestamp}.{body}")>`.
pub const HEADER_SIGNATURE: &str = "Verdict-Signature";
/// Response header set to `true` when verdict answered from its stored response.
pub const HEADER_REPLAYED: &str = "Idempotent-Replayed";

/// Attempts per signal unless configured: enough to ride out a short outage.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// First backoff ceiling unless configured.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(250);
/// Largest backoff ceiling unless configured.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Per-attempt deadline unless configured; ingest includes an inline callback of up to 5 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// verdict's answer to a signal that it accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct SignalOutcome {
    /// The 2xx status.
    pub status: u16,
    /// The response body (the decision); `Null` if empty, a string if not JSON.
    pub body: Value,
    /// Whether verdict replayed a stored response (`Idempotent-Replayed: true`).
    pub replayed: bool,
    /// The key every attempt carried.
    pub idempotency_key: String,
    /// Attempts made, the successful one included.
    pub attempts: u32,
}

/// Sends signals to one verdict deployment as one tenant; cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: Url,
    authorization: HeaderValue,
    secret: Option<Secret>,
    max_attempts: u32,
    backoff: Backoff,
}

// The API key and secret never reach a log line.
impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.url.as_str())
            .field("signing", &self.secret.is_some())
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

/// Configures a [`Client`].
pub struct ClientBuilder {
    base_url: String,
    api_key: String,
    secret: Option<Secret>,
    max_attempts: u32,
    backoff_base: Duration,
    backoff_max: Duration,
    timeout: Duration,
}

impl ClientBuilder {
    /// Signs every attempt with the tenant's inbound secret (`whsec_…`); omit only if the tenant turned signatures off.
    pub fn signing_secret(mut self, secret: Secret) -> ClientBuilder {
        self.secret = Some(secret);
        self
    }

    /// Attempts per signal, the first included; default [`DEFAULT_MAX_ATTEMPTS`].
    pub fn max_attempts(mut self, attempts: u32) -> ClientBuilder {
        self.max_attempts = attempts;
        self
    }

    /// Backoff ceilings between attempts: `base`, doubling per retry, capped at `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> ClientBuilder {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Deadline for one attempt; default [`DEFAULT_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.timeout = timeout;
        self
    }

    /// Checks the configuration and builds the client.
    pub fn build(self) -> Result<Client, ClientError> {
        let mut base = self.base_url.trim().to_owned();
        // Without a trailing slash, joining would replace the base's last path segment.
        if !base.ends_with('/') {
            base.push('/');
        }
        let url = Url::parse(&base)
            .and_then(|base| base.join("v1/signals"))
            .map_err(|e| ClientError::Config(format!("invalid base URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ClientError::Config("base URL must be http or https".into()));
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", self.api_key))
            .map_err(|_| ClientError::Config("API key is not a valid header value".into()))?;
        authorization.set_sensitive(true);
        if self.max_attempts == 0 {
            return Err(ClientError::Config(
                "max_attempts must be at least 1".into(),
            ));
        }
        if self.backoff_base > self.backoff_max {
            return Err(ClientError::Config(
                "backoff base must not exceed its maximum".into(),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(self.timeout)
            // A redirected POST may become a GET or go elsewhere; the endpoint does not move.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Config(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            url,
            authorization,
            secret: self.secret,
            max_attempts: self.max_attempts,
            backoff: Backoff::new(self.backoff_base, self.backoff_max),
        })
    }
}

/// One attempt's answer.
struct Reply {
    status: StatusCode,
    retry_after: Option<Duration>,
    replayed: bool,
    body: Value,
}

impl Client {
    /// Starts configuring a client for the deployment at `base_url`, authenticating with `api_key`.
    pub fn builder(base_url: impl Into<String>, api_key: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            api_key: api_key.into(),
            secret: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            backoff_base: DEFAULT_BACKOFF_BASE,
            backoff_max: DEFAULT_BACKOFF_MAX,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The endpoint signals are posted to.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Serialises `signal` once and sends it (see [`send_signal_bytes`](Client::send_signal_bytes)).
    pub async fn send_signal(&self, signal: &Value) -> Result<SignalOutcome, ClientError> {
        let body = serde_json::to_vec(signal).map_err(ClientError::Serialize)?;
        self.send_signal_bytes(&body).await
    }

    /// Sends a serialised signal under a fresh random key, retrying with the same key and bytes.
    ///
    /// The key is a UUIDv4 generated here, never derived from the signal: two signals that
    /// happen to share an identifier are still two signals.
    pub async fn send_signal_bytes(&self, body: &[u8]) -> Result<SignalOutcome, ClientError> {
        self.send(body, Uuid::new_v4().to_string()).await
    }

    /// Sends again a signal whose earlier send gave up, with the key from that error and the same bytes.
    ///
    /// With a new key verdict would process the signal a second time if the first send got through.
    pub async fn resend_signal_bytes(
        &self,
        body: &[u8],
        idempotency_key: &str,
    ) -> Result<SignalOutcome, ClientError> {
        let valid = (1..=255).contains(&idempotency_key.len())
            && idempotency_key.bytes().all(|b| b.is_ascii_graphic());
        if !valid {
            return Err(ClientError::InvalidKey);
        }
        self.send(body, idempotency_key.to_owned()).await
    }

    #[tracing::instrument(skip_all)]
    async fn send(&self, body: &[u8], key: String) -> Result<SignalOutcome, ClientError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let retry = attempts - 1;
            let last = attempts >= self.max_attempts;
            let reply = match self.attempt(body, &key).await {
                Ok(reply) => reply,
                // A builder error is ours, not the network's: retrying repeats it.
                Err(error) if last || error.is_builder() => {
                    return Err(ClientError::Network {
                        attempts,
                        idempotency_key: key,
                        error,
                    });
                }
                Err(error) => {
                    let delay = self.backoff.delay(retry);
                    tracing::warn!(attempts, %error, ?delay, "signal attempt failed; retrying");
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            let disposition = Disposition::of(reply.status);
            match disposition {
                Disposition::Accepted => {
                    return Ok(SignalOutcome {
                        status: reply.status.as_u16(),
                        body: reply.body,
                        replayed: reply.replayed,
                        idempotency_key: key,
                        attempts,
                    });
                }
                Disposition::KeyReused => {
                    return Err(ClientError::KeyReusedWithDifferentBody {
                        idempotency_key: key,
                        problem: reply.body,
                    });
                }
                Disposition::Rejected => {
                    return Err(ClientError::Rejected {
                        status: reply.status.as_u16(),
                        problem: reply.body,
                    });
                }
                Disposition::InFlight | Disposition::Transient if last => {
                    return Err(ClientError::Unavailable {
                        status: reply.status.as_u16(),
                        attempts,
                        idempotency_key: key,
                        problem: reply.body,
                    });
                }
                Disposition::InFlight | Disposition::Transient => {
                    let delay = wait(disposition, reply.retry_after, &self.backoff, retry);
                    tracing::info!(attempts, status = %reply.status, ?delay, "signal not yet accepted; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// One signed POST of the same bytes; an unreadable answer counts as a transport failure.
    async fn attempt(&self, body: &[u8], key: &str) -> Result<Reply, reqwest::Error> {
        let mut request = self
            .http
            .post(self.url.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(HEADER_IDEMPOTENCY_KEY, key);
        if let Some(secret) = &self.secret {
            // A fresh timestamp per attempt, so a retry after minutes is not refused as stale.
            let timestamp = unix_now_secs();
            // `v2` signs the key too (what tenants require now); `v1` is for tenants set up
            // before that, which take it until their operator turns it off.
            let signature = format!(
                "{} {}",
                secret.sign_content_as("v2", &keyed_content(timestamp, key, body)),
                secret.sign_content(&signed_content(timestamp, body))
            );
            request = request
                .header(HEADER_TIMESTAMP, timestamp.to_string())
                .header(HEADER_SIGNATURE, signature);
        }
        let response = request.body(body.to_vec()).send().await?;
        let status = response.status();
        let headers = response.headers();
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let replayed = headers
            .get(HEADER_REPLAYED)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        // If the body is lost after a 2xx, the retry gets the stored answer replayed: safe.
        let bytes = response.bytes().await?;
        Ok(Reply {
            status,
            retry_after,
            replayed,
            body: parse_body(&bytes),
        })
    }
}

/// What `Verdict-Signature`'s `v2` signs: `"{timestamp}.{idempotency key}.{body}"`.
pub fn keyed_content(timestamp: i64, key: &str, body: &[u8]) -> Vec<u8> {
    let mut content = format!("{timestamp}.{key}.").into_bytes();
    content.extend_from_slice(body);
    content
}

/// What `Verdict-Signature`'s `v1` signs: `{timestamp}.{body}` (the key left out).
pub fn signed_content(timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut content = format!("{timestamp}.").into_bytes();
    content.extend_from_slice(body);
    content
}

/// A response body as JSON; `Null` when empty, a string when not JSON.
fn parse_body(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn unix_now_secs() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signed_content_is_timestamp_dot_body() {
        assert_eq!(signed_content(1_700_000_000, b"{}"), b"1700000000.{}");
        assert_eq!(
            keyed_content(1_700_000_000, "k-1", b"{}"),
            b"1700000000.k-1.{}"
        );
    }

    #[test]
    fn the_endpoint_keeps_the_base_path() {
        let client = Client::builder("http://127.0.0.1:9/api", "k")
            .build()
            .expect("client");
        assert_eq!(client.url().as_str(), "http://127.0.0.1:9/api/v1/signals");
        let client = Client::builder("https://verdict.example/", "k")
            .build()
            .expect("client");
        assert_eq!(client.url().as_str(), "https://verdict.example/v1/signals");
    }

    #[test]
    fn the_debug_form_shows_neither_key_nor_secret() {
        let client = Client::builder("http://127.0.0.1:9", "vk_live_supersecret")
            .signing_secret(Secret::from_bytes(b"hmac key bytes".to_vec()))
            .build()
            .expect("client");
        let debug = format!("{client:?}");
        assert!(!debug.contains("supersecret"), "{debug}");
        assert!(!debug.contains("hmac"), "{debug}");
    }

    #[test]
    fn unusable_configurations_are_refused() {
        let cases = [
            Client::builder("not a url", "k").build(),
            Client::builder("ftp://example.com", "k").build(),
            Client::builder("http://example.com", "bad\nkey").build(),
            Client::builder("http://example.com", "k")
                .max_attempts(0)
                .build(),
            Client::builder("http://example.com", "k")
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
                .build(),
        ];
        for case in cases {
            assert!(matches!(case, Err(ClientError::Config(_))), "{case:?}");
        }
    }

    #[test]
    fn response_bodies_are_json_or_text_or_null() {
        assert_eq!(parse_body(b""), Value::Null);
        assert_eq!(parse_body(br#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(parse_body(b"oops"), Value::String("oops".into()));
    }
}
