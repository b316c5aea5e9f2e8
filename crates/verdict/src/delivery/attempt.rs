//! One delivery attempt: sign, POST within the deadline, classify the answer. The caller has
//! already recorded the delivery durably; this never touches the database.

use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use verdict_webhooks::{Secret, signed_headers};

use super::destination::refusal;
use super::schedule::AttemptOutcome;

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
}

/// A signed callback ready to send.
pub struct Outgoing<'a> {
    pub url: &'a str,
    pub webhook_id: &'a str,
    pub payload: &'a [u8],
    pub secrets: &'a [Secret],
}

/// Sends `out` once, giving up at `deadline`.
pub async fn send(
    client: &reqwest::Client,
    out: &Outgoing<'_>,
    deadline: Duration,
    allow_private: bool,
) -> Attempt {
    let started = Instant::now();
    if let Some(why) = literal_refusal(out.url, allow_private) {
        return failed(AttemptOutcome::Terminal, started, why);
    }
    let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut request = client
        .post(out.url)
        .timeout(deadline)
        .header(CONTENT_TYPE, "application/json")
        .body(out.payload.to_vec());
    for (name, value) in signed_headers(out.secrets, out.webhook_id, timestamp, out.payload) {
        request = request.header(name, value);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            let why = error_chain(&err);
            // A refused destination is configuration, not a passing fault: do not retry it.
            let outcome = if why.contains("destination refused") {
                AttemptOutcome::Terminal
            } else {
                AttemptOutcome::Retryable { retry_after: None }
            };
            return failed(outcome, started, why);
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

/// Refuses IP-literal URLs in forbidden ranges (hostnames are checked by the resolver).
fn literal_refusal(url: &str, allow_private: bool) -> Option<String> {
    let parsed = match reqwest::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => u,
        _ => return Some("destination refused: not an http(s) URL".into()),
    };
    if allow_private {
        return None;
    }
    let ip = match parsed.host()? {
        url::Host::Ipv4(v4) => std::net::IpAddr::V4(v4),
        url::Host::Ipv6(v6) => std::net::IpAddr::V6(v6),
        url::Host::Domain(_) => return None,
    };
    refusal(ip).map(|why| format!("destination refused: {why}"))
}

async fn read_excerpt(mut response: reqwest::Response) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out.truncate(EXCERPT_BYTES);
    out
}

fn failed(outcome: AttemptOutcome, started: Instant, error: String) -> Attempt {
    Attempt {
        outcome,
        status_code: None,
        latency: started.elapsed(),
        error: Some(error),
        excerpt: None,
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

    #[test]
    fn ip_literals_in_internal_ranges_are_refused_unless_allowed() {
        assert!(literal_refusal("http://127.0.0.1:9000/hook", false).is_some());
        assert!(literal_refusal("http://[::1]/hook", false).is_some());
        assert!(literal_refusal("http://169.254.169.254/latest", false).is_some());
        assert!(literal_refusal("http://127.0.0.1:9000/hook", true).is_none());
        assert!(literal_refusal("http://93.184.216.34/hook", false).is_none());
        assert!(literal_refusal("ftp://example.com/", true).is_some());
    }
}
