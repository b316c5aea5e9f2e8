//! A signal's inbound signature, in either scheme a tenant's sender may use, checked over the
//! raw bytes before anything parses them:
//! - **Standard Webhooks**: `webhook-id`, `webhook-timestamp` and `webhook-signature` (`v1,`
//!   over `"{id}.{timestamp}.{body}"`). The `webhook-id` is the signal's idempotency key, so the
//!   key is signed: captured bytes cannot be replayed under a new one.
//! - **verdict's own**: `Verdict-Timestamp` and `Verdict-Signature`, `v2,` over
//!   `"{timestamp}.{Idempotency-Key}.{body}"` (the key signed too, as the header sends it), or `v1,` over
//!   `"{timestamp}.{body}"`, which leaves the key out: taken only from tenants set up before the
//!   key was signed, until their operator turns that off (`verdict tenant require-signed-keys`).
//!
//! Every scheme allows a timestamp within [`TIMESTAMP_TOLERANCE_SECS`] of our clock and
//! several signatures (rotation), at most eight.

use axum::http::HeaderMap;
use verdict_webhooks::{Secret, signature_matches, signature_matches_as};

use crate::app::error::AuthError;

/// How far a signature's timestamp may be from our clock, either way.
pub const TIMESTAMP_TOLERANCE_SECS: i64 = 300;

/// The version tag of verdict's scheme over the idempotency key too.
const KEYED: &str = "v2";
/// The version tag of Standard Webhooks' HMAC signatures, and of verdict's keyless one.
const V1: &str = "v1";

/// A request's signature headers, with the content each accepted version signs.
pub(super) struct Signed<'a> {
    /// The signature entries, space-separated.
    header: &'a str,
    /// The version whose content covers the idempotency key, and that content.
    keyed: (&'static str, Vec<u8>),
    /// verdict's `v1` content, which leaves the key out (`None` for Standard Webhooks).
    keyless: Option<Vec<u8>>,
}

impl<'a> Signed<'a> {
    /// The request's signature over `body` (Standard Webhooks' when it sends
    /// `webhook-signature`, else verdict's), checked for presence and freshness. What is
    /// signed is the key as sent: the `Idempotency-Key` header's value (quoted or bare), or
    /// the `webhook-id`.
    pub(super) fn read(headers: &'a HeaderMap, body: &[u8]) -> Result<Self, AuthError> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(signature) = header("webhook-signature") {
            let (Some(id), Some(timestamp)) = (header("webhook-id"), header("webhook-timestamp"))
            else {
                return Err(AuthError::MissingSignature);
            };
            let timestamp = fresh(timestamp)?;
            return Ok(Self {
                header: signature,
                keyed: (V1, joined(&[id.as_bytes(), timestamp.as_bytes(), body])),
                keyless: None,
            });
        }
        let (Some(timestamp), Some(signature)) =
            (header("verdict-timestamp"), header("verdict-signature"))
        else {
            return Err(AuthError::MissingSignature);
        };
        let timestamp = fresh(timestamp)?;
        let key = headers
            .get("idempotency-key")
            .map_or(&b""[..], |v| v.as_bytes());
        Ok(Self {
            header: signature,
            keyed: (KEYED, joined(&[timestamp.as_bytes(), key, body])),
            keyless: Some(joined(&[timestamp.as_bytes(), body])),
        })
    }

    /// Whether one of `secrets` made the signature; with `key_signed`, only a signature
    /// that covers the idempotency key counts.
    pub(super) fn by(&self, secrets: &[Secret], key_signed: bool) -> Result<(), AuthError> {
        let (version, content) = &self.keyed;
        if signature_matches_as(version, secrets, content, self.header) {
            return Ok(());
        }
        match &self.keyless {
            Some(content) if signature_matches(secrets, content, self.header) => {
                if key_signed {
                    Err(AuthError::KeyNotSigned)
                } else {
                    Ok(())
                }
            }
            _ => Err(AuthError::BadSignature),
        }
    }
}

/// The trimmed timestamp, if it is unix seconds within the tolerance of our clock.
fn fresh(timestamp: &str) -> Result<&str, AuthError> {
    let timestamp = timestamp.trim();
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| AuthError::MalformedTimestamp)?;
    let now = crate::clock::now_utc().unix_timestamp();
    if now.abs_diff(ts) > TIMESTAMP_TOLERANCE_SECS.unsigned_abs() {
        return Err(AuthError::StaleTimestamp);
    }
    Ok(timestamp)
}

/// `parts` joined by `.`.
fn joined(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        out.extend_from_slice(part);
    }
    out
}
