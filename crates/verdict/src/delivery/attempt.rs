//! One delivery attempt: sign, POST within the deadline, classify the answer. The caller has
//! already recorded the delivery durably; this never touches the database.

use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use verdict_webhooks::{Secret, signed_headers};

use super::schedule::AttemptOutcome;
use crate::destination::{DestinationPolicy, DestinationRefused, UrlError, check_url};
use crate::telemetry;

/// How much of a response body is kept with the attempt.
const EXCERPT_BYTES: usize = 1024;

/// What happened on one attempt, as recorded.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub outcome: AttemptOutcome,
    pub status_code: Option<u16>,
    pub latency: Duration,
    pub error: Option<String>,
    pub excerpt: Option<Vec<u8>>,
    /// A connector found the effect already in place (a SCIM user already inactive).
    pub already_done: bool,
    /// Whether the request may have reached the receiver (it was sent, or may have been).
    pub sent: bool,
}

/// A signed callback ready to send.
pub struct Outgoing<'a> {
    pub url: &'a str,
    pub webhook_id: &'a str,
    pub payload: &'a [u8],
    pub secrets: &'a [Secret],
}

/// Why an attempt is not made when the tenant has no live webhook secret.
pub const NO_SECRET: &str = "not sent: the tenant has no live webhook secret and callbacks are \
     never sent unsigned (issue one with `verdict tenant rotate-secret --purpose webhook`)";

/// Sends `out` once, giving up at `deadline`, if `policy` allows its destination and there is a
/// secret to sign it with.
pub async fn send(
    client: &reqwest::Client,
    out: &Outgoing<'_>,
    deadline: Duration,
    policy: DestinationPolicy,
) -> Attempt {
    let started = Instant::now();
    // Checked on the URL exactly as reqwest requests it: reqwest connects to an IP literal
    // without asking the resolver, so this is the only check an IP literal gets.
    let url = match reqwest::Url::parse(out.url) {
        Ok(url) => url,
        Err(_) => {
            let why = format!("destination refused: {}", UrlError::NotHttp);
            return failed(AttemptOutcome::Terminal, started, why);
        }
    };
    match check_url(&url, policy) {
        Ok(()) => {}
        Err(UrlError::Refused(refusal)) => {
            let why = DestinationRefused(refusal).to_string();
            return failed(AttemptOutcome::Terminal, started, why);
        }
        Err(other) => {
            let why = format!("destination refused: {other}");
            return failed(AttemptOutcome::Terminal, started, why);
        }
    }
    if out.secrets.is_empty() {
        // A secret may be issued before the next retry; until then nothing leaves unsigned.
        let outcome = AttemptOutcome::Retryable { retry_after: None };
        return failed(outcome, started, NO_SECRET.into());
    }
    let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut request = client
        .post(url.clone())
        .timeout(deadline)
        .header(CONTENT_TYPE, "application/json")
        .body(out.payload.to_vec());
    for (name, value) in signed_headers(out.secrets, out.webhook_id, timestamp, out.payload) {
        request = request.header(name, value);
    }
    if let Some(trace) = telemetry::outbound_headers() {
        request = request.headers(trace);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            // A refused destination is configuration, not a passing fault: do not retry it.
            if let Some(refused) = DestinationRefused::found_in(&err) {
                return failed(AttemptOutcome::Terminal, started, refused.to_string());
            }
            let outcome = AttemptOutcome::Retryable { retry_after: None };
            return failed(outcome, started, describe(err, &url));
        }
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, SystemTime::now()));
    let outcome = classify(status, retry_after);
    // The excerpt is best effort and bounded by the same deadline.
    let remaining = deadline.saturating_sub(started.elapsed());
    let excerpt = tokio::time::timeout(remaining, read_excerpt(response))
        .await
        .unwrap_or_default();
    Attempt {
        outcome,
        status_code: Some(status.as_u16()),
        latency: started.elapsed(),
        error: (!status.is_success()).then(|| format!("HTTP {status}")),
        excerpt: Some(excerpt),
        already_done: false,
        sent: true,
    }
}

/// How long a `Retry-After` value asks to wait from `now`: delay-seconds or an HTTP-date
/// (RFC 9110 §10.2.3; the three date formats `httpdate` reads). A date already past asks for
/// no wait; anything else unreadable is ignored.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits too many for u64 are a wait longer than any schedule.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The scheduling outcome for a response status.
pub fn classify(status: StatusCode, retry_after: Option<Duration>) -> AttemptOutcome {
    match status.as_u16() {
        200..=299 => AttemptOutcome::Delivered,
        410 => AttemptOutcome::Gone,
        429 | 503 => AttemptOutcome::Retryable { retry_after },
        500..=599 => AttemptOutcome::Retryable { retry_after: None },
        _ => AttemptOutcome::Terminal,
    }
}

/// The error as stored and shown: its cause chain, with the URL's query, fragment and userinfo
/// taken out (a callback URL often carries a token there).
pub(super) fn describe(mut err: reqwest::Error, url: &reqwest::Url) -> String {
    if let Some(shown) = err.url_mut() {
        redact(shown);
    }
    let mut text = error_chain(&err);
    // And anywhere else a cause might have quoted them.
    let secrets = [
        url.query(),
        url.fragment(),
        url.password(),
        Some(url.username()),
    ];
    for secret in secrets.into_iter().flatten().filter(|s| !s.is_empty()) {
        text = text.replace(secret, "[redacted]");
    }
    text
}

/// Drops the parts of a URL that may carry credentials.
pub fn redact(url: &mut reqwest::Url) {
    url.set_query(None);
    url.set_fragment(None);
    // Only fails for URLs that cannot have userinfo, which then have none.
    let _ = url.set_username("");
    let _ = url.set_password(None);
}

async fn read_excerpt(response: reqwest::Response) -> Vec<u8> {
    read_at_most(response, EXCERPT_BYTES).await
}

/// The first `max` bytes of a response's body (fewer if it ends or fails sooner).
pub(super) async fn read_at_most(mut response: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match response.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(max);
    out
}

/// An attempt that sent nothing, for `error`.
pub(super) fn failed(outcome: AttemptOutcome, started: Instant, error: String) -> Attempt {
    Attempt {
        outcome,
        status_code: None,
        latency: started.elapsed(),
        error: Some(error),
        excerpt: None,
        already_done: false,
        sent: false,
    }
}

fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_classify_as_the_contract_says() {
        assert_eq!(classify(StatusCode::OK, None), AttemptOutcome::Delivered);
        assert_eq!(
            classify(StatusCode::NO_CONTENT, None),
            AttemptOutcome::Delivered
        );
        assert_eq!(
            classify(StatusCode::BAD_REQUEST, None),
            AttemptOutcome::Terminal
        );
        assert_eq!(classify(StatusCode::FOUND, None), AttemptOutcome::Terminal);
        assert_eq!(classify(StatusCode::GONE, None), AttemptOutcome::Gone);
        let wait = Some(Duration::from_secs(9));
        assert_eq!(
            classify(StatusCode::TOO_MANY_REQUESTS, wait),
            AttemptOutcome::Retryable { retry_after: wait }
        );
        assert_eq!(
            classify(StatusCode::SERVICE_UNAVAILABLE, wait),
            AttemptOutcome::Retryable { retry_after: wait }
        );
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY, wait),
            AttemptOutcome::Retryable { retry_after: None }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 09:49:37 GMT", now),
            Some(Duration::from_secs(3600))
        );
        // The obsolete forms a recipient must still accept.
        assert_eq!(
            retry_after("Sunday, 06-Nov-94 08:50:37 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            retry_after("Sun Nov  6 08:49:47 1994", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 07:49:37 GMT", now),
            Some(Duration::ZERO),
            "a date already past asks for no wait"
        );
        assert_eq!(
            retry_after("99999999999999999999999", now),
            Some(Duration::from_secs(u64::MAX))
        );
        for junk in ["", "-5", "1.5", "soon", "Sun, 06 Nov 1994 25:00:00 GMT"] {
            assert_eq!(retry_after(junk, now), None, "{junk:?}");
        }
    }

    fn outgoing<'a>(url: &'a str, secrets: &'a [verdict_webhooks::Secret]) -> Outgoing<'a> {
        Outgoing {
            url,
            webhook_id: "msg_1",
            payload: b"{}",
            secrets,
        }
    }

    #[tokio::test]
    async fn refused_urls_and_missing_secrets_fail_before_any_request() {
        let client = reqwest::Client::new();
        let secret = [verdict_webhooks::Secret::generate()];
        let strict = DestinationPolicy::default();
        let deadline = Duration::from_secs(1);
        for url in [
            "http://127.1:9/",
            "http://[::1]:9/",
            "ftp://example.com/",
            "nonsense",
        ] {
            let a = send(&client, &outgoing(url, &secret), deadline, strict).await;
            assert_eq!(a.outcome, AttemptOutcome::Terminal, "{url}");
            assert!(
                a.error.unwrap().starts_with("destination refused: "),
                "{url}"
            );
        }
        let open = DestinationPolicy {
            allow_private: true,
            allow_link_local: true,
        };
        let a = send(
            &client,
            &outgoing("http://127.0.0.1:9/", &[]),
            deadline,
            open,
        )
        .await;
        assert_eq!(a.outcome, AttemptOutcome::Retryable { retry_after: None });
        assert_eq!(a.error.as_deref(), Some(NO_SECRET));
        assert_eq!(a.status_code, None);
    }

    #[test]
    fn redacting_a_url_keeps_where_it_goes_and_drops_what_it_carries() {
        let mut url =
            reqwest::Url::parse("https://user:pw@h.example/cb?token=s3cret#frag").unwrap();
        redact(&mut url);
        assert_eq!(url.as_str(), "https://h.example/cb");
    }
}
