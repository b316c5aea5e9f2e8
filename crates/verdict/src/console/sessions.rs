//! Console sessions on the server: the cookie holds a random token of 32 bytes and nothing
//! else; the database holds its SHA-256 with the tenant, the API key and its scope, and when
//! the session ends (after an idle time and at the latest an absolute one). Sign-out deletes
//! the row, and a revoked key ends its sessions at the next request.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::ConsoleStore;
use crate::store::{ConsoleSession, KeyGrant, NewConsoleSession, StoreError};

/// The cookie that holds the session's token.
pub const COOKIE: &str = "verdict_console";

/// Characters of a token: 32 bytes in unpadded base64url.
const TOKEN_CHARS: usize = 43;

/// How long sessions last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLifetimes {
    /// Without use.
    pub idle: Duration,
    /// At most, however much it is used.
    pub absolute: Duration,
}

impl Default for SessionLifetimes {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(crate::config::DEFAULT_CONSOLE_SESSION_IDLE_SECS),
            absolute: Duration::from_secs(crate::config::DEFAULT_CONSOLE_SESSION_MAX_SECS),
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SessionLifetimes {
    /// How far a session's idle end may lag before a request moves it on: a write at most
    /// once a minute per session (sooner for short idle times), not on every page.
    fn extend_after(&self) -> i64 {
        ms(self.idle / 4).min(60_000)
    }
}

/// A session's token as the cookie carries it, and the digest it is stored under.
pub struct Token {
    value: String,
    digest: [u8; 32],
}

impl Token {
    /// A fresh token from the system's random source.
    fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let value = URL_SAFE_NO_PAD.encode(bytes);
        Self {
            digest: digest(&value),
            value,
        }
    }

    /// The digest of the token a request's cookie carries, if it carries one of the right
    /// form (anything else is not looked up).
    pub fn digest_from(headers: &HeaderMap) -> Option<[u8; 32]> {
        let value = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(name, _)| *name == COOKIE)
            .map(|(_, value)| value)?;
        let well_formed = value.len() == TOKEN_CHARS
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        well_formed.then(|| digest(value))
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The `Set-Cookie` that carries `token`: only to `/console`, never to scripts or other sites,
/// and over TLS only when the request came that way.
pub fn cookie(token: &Token, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={}; Path=/console; HttpOnly; SameSite=Strict{secure}",
        token.value
    ))
    .ok()
}

/// The `Set-Cookie` that removes the session's cookie.
pub fn cleared() -> HeaderValue {
    HeaderValue::from_static(
        "verdict_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
    )
}

/// Opens a session for `grant` at `now`: stores it, returns the token for the cookie.
pub async fn open(
    store: &dyn ConsoleStore,
    lifetimes: SessionLifetimes,
    grant: &KeyGrant,
    now: i64,
) -> Result<Token, StoreError> {
    let token = Token::generate();
    let expires_at = now.saturating_add(ms(lifetimes.absolute));
    store
        .insert_console_session(&NewConsoleSession {
            id_hash: token.digest,
            tenant_id: grant.tenant.id,
            api_key_id: grant.key_id,
            scope: grant.scope,
            created_at: now,
            expires_at,
            idle_until: now.saturating_add(ms(lifetimes.idle)).min(expires_at),
        })
        .await?;
    Ok(token)
}

/// The live session stored under `digest` at `now`, its idle end moved on if it lags.
pub async fn resume(
    store: &dyn ConsoleStore,
    lifetimes: SessionLifetimes,
    digest: &[u8; 32],
    now: i64,
) -> Result<Option<ConsoleSession>, StoreError> {
    let Some(session) = store.console_session(digest, now).await? else {
        return Ok(None);
    };
    let idle_until = now
        .saturating_add(ms(lifetimes.idle))
        .min(session.expires_at);
    if idle_until.saturating_sub(session.idle_until) > lifetimes.extend_after() {
        // The page is shown even if this write fails: the session only ends sooner.
        if let Err(err) = store.extend_console_session(digest, idle_until).await {
            tracing::warn!(error = ?err, "extending a console session failed");
        }
    }
    Ok(Some(session))
}

/// Ends the session stored under `digest`.
pub async fn end(store: &dyn ConsoleStore, digest: &[u8; 32]) -> Result<(), StoreError> {
    store.delete_console_session(digest).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_random_bytes_and_only_well_formed_cookies_are_looked_up() {
        let a = Token::generate();
        let b = Token::generate();
        assert_eq!(a.value.len(), TOKEN_CHARS);
        assert_ne!(a.value, b.value);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={}", a.value)).unwrap(),
        );
        assert_eq!(Token::digest_from(&headers), Some(a.digest));
        for bad in [
            "",
            "short",
            &format!("{}=", &a.value[..42]),
            &"!".repeat(43),
        ] {
            headers.insert(
                header::COOKIE,
                HeaderValue::from_str(&format!("{COOKIE}={bad}")).unwrap(),
            );
            assert_eq!(Token::digest_from(&headers), None, "{bad}");
        }
    }

    #[test]
    fn a_busy_session_is_written_at_most_once_a_minute() {
        let l = SessionLifetimes::default();
        assert_eq!(l.extend_after(), 60_000);
        let short = SessionLifetimes {
            idle: Duration::from_secs(4),
            absolute: Duration::from_secs(60),
        };
        assert_eq!(short.extend_after(), 1000);
    }
}
