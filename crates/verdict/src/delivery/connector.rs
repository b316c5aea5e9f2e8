//! One call to a tenant's connector for a stored action request: a signed POST to an HTTP
//! connector, or a SCIM lookup and `PATCH` of `active` (RFC 7644). Classified like a callback
//! attempt, with what differs: 409 from an HTTP connector is "in progress, retry"; a 410 is
//! terminal but disables nothing; a SCIM user already in the wanted state is `already_done`;
//! and an at-most-once connector's ambiguous outcome is `Unknown`, never retried.

use std::time::{Duration, Instant, SystemTime};

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use verdict_webhooks::{Secret, signed_headers};

use super::attempt::{Attempt, describe, failed, read_at_most, retry_after};
use super::schedule::AttemptOutcome;
use crate::connectors::request::ActionRequest;
use crate::destination::{DestinationPolicy, check_url};
use crate::domain::{ConnectorKind, Guarantee, MatchAttribute};
use crate::store::ConnectorRecord;

/// The most of a SCIM answer read, in bytes: a filter on a unique attribute finds one user.
const MAX_SCIM_ANSWER_BYTES: usize = 64 * 1024;

/// What a connector is asked for: the stored request (its bytes and what they say), with the
/// key every attempt repeats.
pub struct Call<'a> {
    pub connector: &'a ConnectorRecord,
    /// The signing secret (HTTP) or bearer token (SCIM), opened.
    pub credential: &'a [u8],
    /// `<event_id>:<action>`.
    pub key: &'a str,
    pub body: &'a [u8],
    pub request: &'a ActionRequest,
}

/// Makes one call within `deadline`.
pub async fn call(
    client: &reqwest::Client,
    call: &Call<'_>,
    deadline: Duration,
    policy: DestinationPolicy,
) -> Attempt {
    let started = Instant::now();
    let url = match reqwest::Url::parse(&call.connector.url) {
        Ok(url) => url,
        Err(_) => {
            return failed(
                AttemptOutcome::Terminal,
                started,
                "the URL is invalid".into(),
            );
        }
    };
    if let Err(refused) = check_url(&url, policy) {
        return failed(
            AttemptOutcome::Terminal,
            started,
            format!("destination refused: {refused}"),
        );
    }
    let attempt = match call.connector.kind {
        ConnectorKind::Http => http(client, call, url, deadline, started).await,
        ConnectorKind::Scim => scim(client, call, url, deadline, started).await,
    };
    at_most_once(attempt, call.connector.guarantee)
}

/// An at-most-once connector is never called twice for what may have acted once: a retryable
/// outcome that the call may have caused (no answer, a timeout, a 5xx) becomes `Unknown`.
fn at_most_once(mut attempt: Attempt, guarantee: Guarantee) -> Attempt {
    let ambiguous = matches!(attempt.outcome, AttemptOutcome::Retryable { .. }) && attempt.sent;
    if guarantee == Guarantee::AtMostOnce && ambiguous {
        attempt.outcome = AttemptOutcome::Unknown;
    }
    attempt
}

async fn http(
    client: &reqwest::Client,
    call: &Call<'_>,
    url: reqwest::Url,
    deadline: Duration,
    started: Instant,
) -> Attempt {
    let secrets = [Secret::from_bytes(call.credential.to_vec())];
    let timestamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let mut request = client
        .post(url.clone())
        .timeout(deadline)
        .header(CONTENT_TYPE, "application/json")
        .header("idempotency-key", call.key)
        .body(call.body.to_vec());
    for (name, value) in signed_headers(&secrets, call.key, timestamp, call.body) {
        request = request.header(name, value);
    }
    let request = traced(request);
    let during = abort_during_call();
    let response = request.send().await;
    drop(during);
    let response = match response {
        Ok(response) => response,
        Err(err) => return unsent_or_ambiguous(err, &url, started),
    };
    let status = response.status();
    let outcome = match status.as_u16() {
        200..=299 => AttemptOutcome::Delivered,
        // In progress on the receiver's side: the same key later.
        409 => AttemptOutcome::Retryable { retry_after: None },
        429 | 503 => AttemptOutcome::Retryable {
            retry_after: asked_wait(response.headers()),
        },
        500..=599 => AttemptOutcome::Retryable { retry_after: None },
        _ => AttemptOutcome::Terminal,
    };
    // No excerpt is kept: a connector's answer may quote the identifier it was sent.
    drop(response);
    Attempt {
        outcome,
        status_code: Some(status.as_u16()),
        latency: started.elapsed(),
        error: (!status.is_success()).then(|| format!("HTTP {status}")),
        excerpt: None,
        already_done: false,
        sent: true,
    }
}

/// Aborts the process while a call is in flight, when the `connector::during_call` failpoint
/// says so: the receiver has the request (tests' receivers take longer than this to answer)
/// and its answer never comes back. Dropping the guard disarms it.
fn abort_during_call() -> DuringCall {
    #[cfg(feature = "failpoints")]
    {
        DuringCall(Some(tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if fail::eval("connector::during_call", |arg| arg).is_some() {
                std::process::abort();
            }
        })))
    }
    #[cfg(not(feature = "failpoints"))]
    DuringCall(None)
}

/// The armed `connector::during_call` failpoint, disarmed on drop.
struct DuringCall(Option<tokio::task::JoinHandle<()>>);

impl Drop for DuringCall {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// What a SCIM connector does for an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Active {
    /// `lock_account`: `active` to false.
    Deactivate,
    /// `unlock_account`: `active` to true.
    Activate,
}

async fn scim(
    client: &reqwest::Client,
    call: &Call<'_>,
    base: reqwest::Url,
    deadline: Duration,
    started: Instant,
) -> Attempt {
    let want = match call.request.action.as_str() {
        "lock_account" => Active::Deactivate,
        "unlock_account" => Active::Activate,
        other => {
            let why = format!("a SCIM connector cannot carry out `{other}`");
            return failed(AttemptOutcome::Terminal, started, why);
        }
    };
    let Some(account) = call.request.subject.account.as_deref() else {
        let why = "the signal names no account to match a SCIM user by".to_owned();
        return failed(AttemptOutcome::Terminal, started, why);
    };
    let token = String::from_utf8_lossy(call.credential).into_owned();
    let users = format!("{}/Users", base.as_str().trim_end_matches('/'));
    let mut lookup = match reqwest::Url::parse(&users) {
        Ok(url) => url,
        Err(_) => {
            return failed(
                AttemptOutcome::Terminal,
                started,
                "the URL is invalid".into(),
            );
        }
    };
    lookup
        .query_pairs_mut()
        .append_pair("filter", &filter(call.connector.match_attribute, account));
    let found = traced(
        client
            .get(lookup)
            .timeout(deadline)
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .header(ACCEPT, "application/scim+json, application/json"),
    )
    .send()
    .await;
    let found = match found {
        Ok(r) => r,
        Err(err) => {
            // A lookup changes nothing: never ambiguous.
            let mut attempt = unsent_or_ambiguous(err, &base, started);
            attempt.sent = false;
            return attempt;
        }
    };
    if !found.status().is_success() {
        let mut attempt = answered(found.status(), found.headers(), started);
        attempt.sent = false;
        return attempt;
    }
    let remaining = deadline.saturating_sub(started.elapsed());
    let body = tokio::time::timeout(remaining, read_at_most(found, MAX_SCIM_ANSWER_BYTES))
        .await
        .unwrap_or_default();
    let user = match first_user(&body) {
        Ok(Some(user)) => user,
        Ok(None) => {
            let why = format!(
                "no SCIM user's {} matches the subject's account",
                call.connector.match_attribute.as_str()
            );
            return failed(AttemptOutcome::Terminal, started, why);
        }
        Err(why) => return failed(AttemptOutcome::Terminal, started, why),
    };
    let wanted = want == Active::Activate;
    if user.active == Some(wanted) {
        return Attempt {
            outcome: AttemptOutcome::Delivered,
            status_code: Some(200),
            latency: started.elapsed(),
            error: None,
            excerpt: None,
            already_done: true,
            sent: false,
        };
    }
    let patch = serde_json::json!({
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
        "Operations": [{"op": "replace", "path": "active", "value": wanted}],
    });
    let remaining = deadline.saturating_sub(started.elapsed());
    let during = abort_during_call();
    let patched = traced(
        client
            .patch(format!("{users}/{}", urlencode_segment(&user.id)))
            .timeout(remaining)
            .header(AUTHORIZATION, format!("Bearer {token}"))
            .header(CONTENT_TYPE, "application/scim+json")
            .body(patch.to_string()),
    )
    .send()
    .await;
    drop(during);
    match patched {
        Ok(r) => answered(r.status(), r.headers(), started),
        Err(err) => unsent_or_ambiguous(err, &base, started),
    }
}

/// `request` with the `traceparent` of the call's span, while traces are on.
fn traced(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    match crate::telemetry::outbound_headers() {
        Some(trace) => request.headers(trace),
        None => request,
    }
}

/// A SCIM filter matching `attribute` equal to `value` (RFC 7644 §3.4.2.2), the value a JSON
/// string so quotes and backslashes in it stay inside it.
fn filter(attribute: MatchAttribute, value: &str) -> String {
    let quoted = serde_json::Value::from(value).to_string();
    format!("{} eq {quoted}", attribute.as_str())
}

/// A SCIM user as a lookup returns it.
#[derive(serde::Deserialize)]
struct ScimUser {
    id: String,
    active: Option<bool>,
}

/// The first user of a SCIM `ListResponse`, if any.
fn first_user(body: &[u8]) -> Result<Option<ScimUser>, String> {
    #[derive(serde::Deserialize)]
    struct ListResponse {
        #[serde(rename = "Resources", default)]
        resources: Vec<ScimUser>,
    }
    let list: ListResponse = serde_json::from_slice(body)
        .map_err(|e| format!("the SCIM lookup's answer is not a ListResponse: {e}"))?;
    if list.resources.len() > 1 {
        return Err("more than one SCIM user matches the subject's account".into());
    }
    let user = list.resources.into_iter().next();
    if user
        .as_ref()
        .is_some_and(|u| u.id.is_empty() || u.id == "." || u.id == "..")
    {
        return Err("the SCIM user's id is not usable in a URL".into());
    }
    Ok(user)
}

/// A SCIM id as one URL path segment.
fn urlencode_segment(id: &str) -> String {
    url::form_urlencoded::byte_serialize(id.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// An answered call classified: 2xx done; 409, 429, 5xx retried; any other status terminal.
fn answered(status: StatusCode, headers: &reqwest::header::HeaderMap, started: Instant) -> Attempt {
    let outcome = match status.as_u16() {
        200..=299 => AttemptOutcome::Delivered,
        409 | 500..=599 => AttemptOutcome::Retryable { retry_after: None },
        429 => AttemptOutcome::Retryable {
            retry_after: asked_wait(headers),
        },
        _ => AttemptOutcome::Terminal,
    };
    Attempt {
        outcome,
        status_code: Some(status.as_u16()),
        latency: started.elapsed(),
        error: (!status.is_success()).then(|| format!("HTTP {status}")),
        excerpt: None,
        already_done: false,
        sent: true,
    }
}

/// A failed send: retryable, and `sent` unless the connection was never made (then the
/// receiver cannot have acted).
fn unsent_or_ambiguous(err: reqwest::Error, url: &reqwest::Url, started: Instant) -> Attempt {
    let sent = !err.is_connect() && !err.is_builder();
    let mut attempt = failed(
        AttemptOutcome::Retryable { retry_after: None },
        started,
        describe(err, url),
    );
    attempt.sent = sent;
    attempt
}

fn asked_wait(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, SystemTime::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_keeps_the_value_inside_its_quotes() {
        assert_eq!(
            filter(MatchAttribute::UserName, "alice@example.com"),
            r#"userName eq "alice@example.com""#
        );
        assert_eq!(
            filter(MatchAttribute::ExternalId, r#"a" or "1" eq "1"#),
            r#"externalId eq "a\" or \"1\" eq \"1""#
        );
    }

    #[test]
    fn a_lookup_locks_only_one_user_by_a_usable_id() {
        let list = |ids: &[&str]| {
            let resources: Vec<_> = ids
                .iter()
                .map(|id| serde_json::json!({"id": id, "active": true}))
                .collect();
            serde_json::json!({"totalResults": ids.len(), "Resources": resources}).to_string()
        };
        assert_eq!(
            first_user(list(&["u1"]).as_bytes()).unwrap().unwrap().id,
            "u1"
        );
        assert!(first_user(list(&[]).as_bytes()).unwrap().is_none());
        let two = first_user(list(&["u1", "u2"]).as_bytes()).err().unwrap();
        assert!(two.contains("more than one"), "{two}");
        for bad in ["..", ".", ""] {
            assert!(first_user(list(&[bad]).as_bytes()).is_err(), "{bad:?}");
        }
        assert!(first_user(b"not json").is_err());
    }

    #[test]
    fn an_ambiguous_outcome_of_an_at_most_once_connector_is_unknown() {
        let sent = Attempt {
            outcome: AttemptOutcome::Retryable { retry_after: None },
            status_code: None,
            latency: Duration::ZERO,
            error: Some("timed out".into()),
            excerpt: None,
            already_done: false,
            sent: true,
        };
        assert_eq!(
            at_most_once(sent.clone(), Guarantee::AtMostOnce).outcome,
            AttemptOutcome::Unknown
        );
        assert!(matches!(
            at_most_once(sent.clone(), Guarantee::ExactlyOnce).outcome,
            AttemptOutcome::Retryable { .. }
        ));
        let unsent = Attempt {
            sent: false,
            ..sent
        };
        assert!(matches!(
            at_most_once(unsent, Guarantee::AtMostOnce).outcome,
            AttemptOutcome::Retryable { .. }
        ));
    }
}
