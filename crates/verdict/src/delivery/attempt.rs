//! One delivery attempt: sign, POST within the deadline, classify the answer. The caller has
//! already recorded the delivery durably; this never touches the database.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{CONTENT_TYPE, RETRY_AFTER};
use verdict_webhooks::{Secret, signed_headers};

use super::destination::refusal;
use super::schedule::Verdict;

/// How much of a response body is kept with the attempt.
const EXCERPT_BYTES: usize = 1024;

/// What happened on one attempt, as recorded.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub verdict: Verdict,
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
        return failed(Verdict::Terminal, started, why);
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
            let verdict = if why.contains("destination refused") {
                Verdict::Terminal
            } else {
                Verdict::Retryable { retry_after: None }
            };
            return failed(verdict, started, why);
        }
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let verdict = classify(status, retry_after);
    // The excerpt is best effort and bounded by the same deadline.
    let remaining = deadline.saturating_sub(started.elapsed());
    let excerpt = tokio::time::timeout(remaining, read_excerpt(response))
        .await
        .unwrap_or_default();
    Attempt {
        verdict,
        status_code: Some(status.as_u16()),
        latency: started.elapsed(),
        error: (!status.is_success()).then(|| format!("HTTP {status}")),
        excerpt: Some(excerpt),
    }
}

/// The scheduling verdict for a response status.
pub fn classify(status: StatusCode, retry_after: Option<Duration>) -> Verdict {
    match status.as_u16() {
        200..=299 => Verdict::Delivered,
        410 => Verdict::Gone,
        429 | 503 => Verdict::Retryable { retry_after },
        500..=599 => Verdict::Retryable { retry_after: None },
        _ => Verdict::Terminal,
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

fn failed(verdict: Verdict, started: Instant, error: String) -> Attempt {
    Attempt {
        verdict,
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
        assert_eq!(classify(StatusCode::OK, None), Verdict::Delivered);
        assert_eq!(classify(StatusCode::NO_CONTENT, None), Verdict::Delivered);
        assert_eq!(classify(StatusCode::BAD_REQUEST, None), Verdict::Terminal);
        assert_eq!(classify(StatusCode::FOUND, None), Verdict::Terminal);
        assert_eq!(classify(StatusCode::GONE, None), Verdict::Gone);
        let wait = Some(Duration::from_secs(9));
        assert_eq!(
            classify(StatusCode::TOO_MANY_REQUESTS, wait),
            Verdict::Retryable { retry_after: wait }
        );
        assert_eq!(
            classify(StatusCode::SERVICE_UNAVAILABLE, wait),
            Verdict::Retryable { retry_after: wait }
        );
        assert_eq!(
            classify(StatusCode::BAD_GATEWAY, wait),
            Verdict::Retryable { retry_after: None }
        );
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
