//! Calls whose outcome is open: an at-most-once connector is never called again for a request a
//! crash left sent with no recorded outcome (it is `unknown`), an operator resolves an unknown
//! outcome (API, CLI, console), and a retry that takes a key over waits for the retry a
//! connector asked for. Each counted on the receiving endpoint itself.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::console::console_cookie;
use crate::common::receiver::{Receiver, Step};
use crate::common::{
    Backend, Server, Tenant, TestDb, action_outcome, assert_problem, new_key, post_json,
    until_not_in_progress,
};

const ALLOW_LOCAL: (&str, &str) = ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1");
/// A dead holder's lock runs out at once.
const LOCK: (&str, &str) = ("VERDICT_LOCK_TIMEOUT_SECS", "1");
/// No worker: the retry of the signal, or a test's `worker --once`, finishes the calls.
const NO_WORKER: (&str, &str) = ("VERDICT_NO_WORKER", "1");
const DEADLINE: (&str, &str) = ("VERDICT_INLINE_DEADLINE_MS", "1000");

/// A SIM swap about `account`, observed `minutes_ago` minutes ago.
fn swap(account: &str, minutes_ago: i64) -> String {
    let observed = time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes_ago);
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({"type": "sim_swap", "subject": {"account": account}, "observed_at": observed})
        .to_string()
}

/// Binds `open_case` to an HTTP connector `cases` at `url`, with `guarantee`.
fn bind_cases(db: &TestDb, tenant: &Tenant, url: &str, guarantee: &str) {
    db.cli(&[
        "connector",
        "set",
        "--tenant",
        &tenant.id,
        "--name",
        "cases",
        "--kind",
        "http",
        "--url",
        url,
        "--guarantee",
        guarantee,
    ]);
    db.set_playbook(
        tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["open_case"]

[actions.open_case]
connector = "cases"
"#,
    );
}

/// The tenant's only action request, as `GET /v1/deliveries` lists it.
async fn the_request(server: &Server, tenant: &Tenant) -> Value {
    let page = server.get(tenant, "/v1/deliveries").await.json();
    let requests: Vec<&Value> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["action"] != "callback")
        .collect();
    assert_eq!(requests.len(), 1, "{page}");
    requests[0].clone()
}

/// The tenant's only action request once an attempt settled it (its record lands in the
/// background, a moment after the answer it made goes out).
async fn the_settled_request(server: &Server, tenant: &Tenant) -> Value {
    for _ in 0..100 {
        let request = the_request(server, tenant).await;
        if request["status"] != "pending" {
            return request;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the request is still pending");
}

/// How a crashed signal's calls are finished.
#[derive(Clone, Copy, Debug)]
enum Finisher {
    /// The client's retry with the same key, which takes the key over.
    Retry,
    /// The delivery worker.
    Worker,
}

/// Aborts the real binary at `failpoint` on an at-most-once connector's call, then finishes
/// the signal with `finisher` once the dead holder's lease is over: the endpoint is called at
/// most once, and the outcome is what a crash at that point allows. Returns the request's
/// delivery and the calls the endpoint got.
async fn crash_at_most_once(
    backend: Backend,
    failpoint: &str,
    finisher: Finisher,
) -> (Value, usize) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    // Slow enough that a crash 100 ms into the call meets it in flight.
    let endpoint = Receiver::start(vec![Step::slow(204, Duration::from_millis(400))]).await;
    bind_cases(&db, &tenant, &endpoint.url, "at_most_once");
    let key = new_key();
    let body = swap("erin", 60);
    let failpoints = format!("{failpoint}=1*return(abort)");
    let doomed = Server::start(
        &db,
        &[
            ALLOW_LOCAL,
            LOCK,
            NO_WORKER,
            DEADLINE,
            ("FAILPOINTS", &failpoints),
        ],
    );
    doomed.send_raw_expecting_crash(&tenant, &key, &body).await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted at {failpoint}"
    );
    // The dead holder's lease on its call (the deadline and 15 s) is over.
    assert_eq!(db.end_leases("action <> 'callback'").await, 1);

    let server = Server::start(&db, &[ALLOW_LOCAL, LOCK, NO_WORKER, DEADLINE]);
    match finisher {
        Finisher::Retry => {
            let reply = until_not_in_progress(|| server.send(&tenant, Some(&key), &body)).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            let request = the_settled_request(&server, &tenant).await;
            let expected = if request["status"] == "unknown" {
                "unknown"
            } else {
                "done"
            };
            assert_eq!(
                action_outcome(&reply.json(), "open_case")["outcome"],
                expected,
                "the retry's answer says where the request stands: {request}"
            );
        }
        Finisher::Worker => {
            let round = db.worker_once(&[ALLOW_LOCAL]);
            assert_eq!(round["attempted"], 1, "{round}");
        }
    }
    let request = the_settled_request(&server, &tenant).await;
    // Nothing is left to call: neither the worker nor a retry calls it again.
    let round = db.worker_once(&[ALLOW_LOCAL]);
    assert_eq!(round["attempted"], 0, "{round}");
    let again = until_not_in_progress(|| server.send(&tenant, Some(&key), &body)).await;
    assert_eq!(again.status, 200, "{}", again.text());
    let event = server
        .event(&tenant, request["event_id"].as_str().unwrap())
        .await;
    let status = request["status"].as_str().unwrap();
    assert_eq!(
        action_outcome(&event, "open_case")["outcome"],
        if status == "unknown" {
            "unknown"
        } else {
            "done"
        },
        "the event shows where the request stands: {event}"
    );
    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    assert!(!dump.contains("erin"), "the account is stored");
    (request, endpoint.received().len())
}

async fn a_crash_during_an_at_most_once_call_leaves_it_unknown_never_called_again(b: Backend) {
    let (request, calls) = crash_at_most_once(b, "connector::during_call", Finisher::Retry).await;
    assert_eq!(calls, 1, "called once, by the process that crashed");
    assert_eq!(request["status"], "unknown", "{request}");
    let (request, calls) = crash_at_most_once(b, "connector::during_call", Finisher::Worker).await;
    assert_eq!(calls, 1, "called once, by the process that crashed");
    assert_eq!(request["status"], "unknown", "{request}");
}

async fn a_crash_after_an_at_most_once_call_before_its_record_leaves_it_unknown(b: Backend) {
    let (request, calls) = crash_at_most_once(b, "connector::after_call", Finisher::Worker).await;
    assert_eq!(calls, 1, "called once, by the process that crashed");
    assert_eq!(request["status"], "unknown", "{request}");
    assert!(
        request["last_error"]
            .as_str()
            .unwrap()
            .starts_with("not called again"),
        "{request}"
    );
    let (request, calls) = crash_at_most_once(b, "connector::after_call", Finisher::Retry).await;
    assert_eq!(calls, 1, "called once, by the process that crashed");
    assert_eq!(request["status"], "unknown", "{request}");
}

async fn a_crash_before_an_at_most_once_call_is_sent_calls_it_once(b: Backend) {
    // Nothing left the process: the call is made once, by whoever finishes the signal.
    let (request, calls) = crash_at_most_once(b, "connector::before_call", Finisher::Retry).await;
    assert_eq!(calls, 1);
    assert_eq!(request["status"], "succeeded", "{request}");
}

/// A connector asked for its retry an hour from now (429, `Retry-After: 3600`); the signal's
/// request then failed before it completed its key. A retry of the signal that takes the key
/// over answers 409 until that time rather than calling early, and calls once it is due.
async fn a_takeover_waits_for_the_retry_a_connector_asked_for(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let endpoint = Receiver::start(vec![Step::status(429).header("retry-after", "3600")]).await;
    bind_cases(&db, &tenant, &endpoint.url, "exactly_once");
    let server = Server::start(
        &db,
        &[
            ALLOW_LOCAL,
            LOCK,
            NO_WORKER,
            ("FAILPOINTS", "ingest::before_complete_calls=1*return"),
        ],
    );
    let key = new_key();
    let body = swap("gina", 60);
    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 503, "{}", failed.text());
    assert_eq!(endpoint.received().len(), 1);
    // The call's attempt is recorded (in the background): due in an hour.
    let mut recorded = false;
    for _ in 0..100 {
        if db.count("delivery_attempts").await == 1 {
            recorded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recorded, "the 429 was recorded");
    let request = the_request(&server, &tenant).await;
    assert_eq!(request["status"], "pending", "{request}");

    // The dead holder's lock runs out; every retry until the hour is over is 409.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..3 {
        let early = server.send(&tenant, Some(&key), &body).await;
        assert_eq!(early.status, 409, "{}", early.text());
        assert!(early.header("retry-after").is_some());
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    assert_eq!(endpoint.received().len(), 1, "not called before it asked");

    // Once due, the takeover calls it (the same key) and completes the signal.
    db.exec("UPDATE deliveries SET next_attempt_at = 0 WHERE action <> 'callback'")
        .await;
    let reply = until_not_in_progress(|| server.send(&tenant, Some(&key), &body)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        action_outcome(&reply.json(), "open_case")["outcome"],
        "done",
        "{}",
        reply.text()
    );
    let calls = endpoint.received();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[0].header("idempotency-key"),
        calls[1].header("idempotency-key")
    );
}

/// The event's action request, from `GET /v1/events/{id}`.
fn request_of(event: &Value) -> Value {
    event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["action"] != "callback")
        .unwrap_or_else(|| panic!("no request in {event}"))
        .clone()
}

/// An at-most-once connector answers 503: the call may have acted, so its outcome is `unknown`
/// and never retried. An operator who asked the tenant's system resolves it `done` (API) or
/// `failed` (CLI, console), with who and why recorded, and the event's outcome follows; any
/// other delivery, and a second resolution, is refused.
async fn an_operator_resolves_an_unknown_outcome_done_or_failed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let endpoint = Receiver::start(Vec::new()).await;
    endpoint.answer_by_default(Step::status(503));
    bind_cases(&db, &tenant, &endpoint.url, "at_most_once");
    let server = Server::start(&db, &[ALLOW_LOCAL, NO_WORKER]);
    let mut events = Vec::new();
    for (account, minutes_ago) in [("hana", 60), ("ivan", 50), ("jana", 40)] {
        let reply = server
            .send(&tenant, Some(&new_key()), &swap(account, minutes_ago))
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let decided = reply.json();
        assert_eq!(action_outcome(&decided, "open_case")["outcome"], "unknown");
        events.push(decided["event_id"].as_str().unwrap().to_owned());
    }
    let event = |id: String| {
        let server = &server;
        let tenant = &tenant;
        async move { server.event(tenant, id).await }
    };
    let mut requests = Vec::new();
    for id in &events {
        let request = request_of(&event(id.clone()).await);
        assert_eq!(request["status"], "unknown", "{request}");
        requests.push(request["id"].as_str().unwrap().to_owned());
    }
    let path = |id: &str| format!("/v1/deliveries/{id}/resolve");
    let why = json!({"outcome": "done", "reason": "the case system shows case 4711"});

    // Refused: a read key, what is not `done` or `failed`, a reason out of bounds, an unknown
    // field, a delivery that does not exist.
    let forbidden = post_json(&server, &reader, &path(&requests[0]), why.clone()).await;
    assert_problem(&forbidden, 403, "a read key");
    for (body, what) in [
        (json!({"outcome": "done", "reason": ""}), "an empty reason"),
        (
            json!({"outcome": "done", "reason": " \n "}),
            "a blank reason",
        ),
        (
            json!({"outcome": "done", "reason": "x".repeat(501)}),
            "a reason of 501 characters",
        ),
        (json!({"outcome": "done"}), "no reason"),
        (
            json!({"outcome": "maybe", "reason": "r"}),
            "an outcome not done or failed",
        ),
        (
            json!({"outcome": "succeeded", "reason": "r"}),
            "a status, not an outcome",
        ),
        (json!({"reason": "r"}), "no outcome"),
        (
            json!({"outcome": "done", "reason": "r", "by": "me"}),
            "an unknown field",
        ),
        (json!(["done"]), "not an object"),
    ] {
        let refused = post_json(&server, &tenant, &path(&requests[0]), body).await;
        assert_problem(&refused, 400, what);
    }
    for id in [uuid::Uuid::now_v7().to_string(), "not-a-uuid".into()] {
        let missing = post_json(&server, &tenant, &path(&id), why.clone()).await;
        assert_problem(&missing, 404, "no such delivery");
    }
    assert_eq!(
        request_of(&event(events[0].clone()).await)["status"],
        "unknown",
        "nothing refused changed it"
    );

    // Done, by the API, with a reason of the longest length.
    let resolved = post_json(&server, &tenant, &path(&requests[0]), why.clone()).await;
    assert_eq!(resolved.status, 200, "{}", resolved.text());
    let resolved = resolved.json();
    assert_eq!(resolved["status"], "succeeded", "{resolved}");
    let last = resolved["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["trigger"], "resolve", "{resolved}");
    assert_eq!(last["reason"], "the case system shows case 4711");
    assert!(
        last["resolved_by"]
            .as_str()
            .is_some_and(|k| k != uuid::Uuid::nil().to_string()),
        "the admin key that resolved it: {last}"
    );
    assert_eq!(
        action_outcome(&event(events[0].clone()).await, "open_case")["outcome"],
        "done"
    );
    // Resolved once: again, or a delivery that is not unknown, is 409.
    let again = post_json(&server, &tenant, &path(&requests[0]), why.clone()).await;
    let problem = assert_problem(&again, 409, "a second resolution");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/delivery-not-unknown"),
        "{problem}"
    );
    assert!(
        problem["detail"].as_str().unwrap().contains("succeeded"),
        "{problem}"
    );
    let longest = json!({"outcome": "failed", "reason": "é".repeat(500)});
    let resolved = post_json(&server, &tenant, &path(&requests[2]), longest).await;
    assert_eq!(
        resolved.status,
        200,
        "a reason of 500 characters: {}",
        resolved.text()
    );

    // Failed, by the CLI.
    let out: Value = serde_json::from_str(&db.cli(&[
        "deliveries",
        "resolve",
        "--tenant",
        &tenant.id,
        &requests[1],
        "--outcome",
        "failed",
        "--reason",
        "no case was opened",
        "--json",
    ]))
    .unwrap();
    assert_eq!(out["status"], "failed", "{out}");
    assert_eq!(
        action_outcome(&event(events[1].clone()).await, "open_case")["outcome"],
        "failed: resolved failed by an operator: no case was opened"
    );
    let twice = db.cli_output(
        &[
            "deliveries",
            "resolve",
            "--tenant",
            &tenant.id,
            &requests[1],
            "--outcome",
            "done",
            "--reason",
            "changed my mind",
        ],
        &[],
    );
    assert!(!twice.status.success());
    let stderr = String::from_utf8_lossy(&twice.stderr);
    assert!(stderr.contains("unknown"), "{stderr}");
    let blank = db.cli_output(
        &[
            "deliveries",
            "resolve",
            "--tenant",
            &tenant.id,
            &requests[1],
            "--outcome",
            "maybe",
            "--reason",
            "r",
        ],
        &[],
    );
    assert!(!blank.status.success(), "an outcome not done or failed");

    // Nothing was called to resolve them, and nothing calls them again.
    let round = db.worker_once(&[ALLOW_LOCAL]);
    assert_eq!(round["attempted"], 0, "{round}");
    assert_eq!(endpoint.received().len(), 3);
    assert!(
        !server.logs().contains("case 4711"),
        "a reason is the record's, not the logs'"
    );
}

/// `pairs` as an `application/x-www-form-urlencoded` body.
fn form_encoded(pairs: &[(&str, &str)]) -> String {
    let encode = |text: &str| -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    char::from(b).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// The console's event page offers an admin Resolve done / Resolve failed on an unknown
/// request (a form with the session's CSRF token and a reason), and resolves it.
async fn the_console_resolves_an_unknown_outcome(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let endpoint = Receiver::start(Vec::new()).await;
    endpoint.answer_by_default(Step::status(503));
    bind_cases(&db, &tenant, &endpoint.url, "at_most_once");
    let server = Server::start(&db, &[ALLOW_LOCAL, NO_WORKER]);
    let decided = server
        .send(&tenant, Some(&new_key()), &swap("kai", 60))
        .await
        .json();
    let event_id = decided["event_id"].as_str().unwrap();
    let reader_cookie = console_cookie(&server, &reader.api_key).await;
    let admin_cookie = console_cookie(&server, &tenant.api_key).await;
    let page = |cookie: &str| {
        server
            .client
            .get(format!("{}/console/events/{event_id}", server.base))
            .header("cookie", cookie)
            .send()
    };
    let read_page = page(&reader_cookie).await.unwrap().text().await.unwrap();
    assert!(
        !read_page.contains("Resolve done"),
        "a read key is offered nothing to resolve"
    );
    let html = page(&admin_cookie).await.unwrap().text().await.unwrap();
    assert!(
        html.contains(">Resolve done<") && html.contains(">Resolve failed<"),
        "{html}"
    );
    let request = request_of(&server.event(&tenant, event_id).await);
    let action = format!(
        "/console/deliveries/{}/resolve",
        request["id"].as_str().unwrap()
    );
    assert!(html.contains(&action), "{html}");
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let post = |cookie: &str, form: &[(&str, &str)]| {
        server
            .client
            .post(format!("{}{action}", server.base))
            .header("cookie", cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form_encoded(form))
            .send()
    };
    let stale = post(
        &admin_cookie,
        &[("csrf", "forged"), ("outcome", "done"), ("reason", "r")],
    )
    .await
    .unwrap();
    assert_eq!(stale.status(), 403, "a form without the session's token");
    let blank = post(
        &admin_cookie,
        &[
            ("csrf", csrf.as_str()),
            ("outcome", "done"),
            ("reason", " "),
        ],
    )
    .await
    .unwrap();
    assert_eq!(blank.status(), 400, "a blank reason");
    let long = "x".repeat(501);
    for (form, what) in [
        (
            [
                ("csrf", csrf.as_str()),
                ("outcome", "done"),
                ("reason", long.as_str()),
            ],
            "a reason of 501 characters",
        ),
        (
            [
                ("csrf", csrf.as_str()),
                ("outcome", "maybe"),
                ("reason", "r"),
            ],
            "an outcome not done or failed",
        ),
    ] {
        let refused = post(&admin_cookie, &form).await.unwrap();
        assert_eq!(refused.status(), 400, "{what}");
    }
    let read = post(
        &reader_cookie,
        &[
            ("csrf", csrf.as_str()),
            ("outcome", "done"),
            ("reason", "r"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        read.status(),
        403,
        "a read key (with another session's token)"
    );
    let done = post(
        &admin_cookie,
        &[
            ("csrf", csrf.as_str()),
            ("outcome", "failed"),
            ("reason", "no case in the case system"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(done.status(), 303, "back to the event");
    let event = server.event(&tenant, event_id).await;
    assert_eq!(
        action_outcome(&event, "open_case")["outcome"],
        "failed: resolved failed by an operator: no case in the case system"
    );
    let html = page(&admin_cookie).await.unwrap().text().await.unwrap();
    assert!(
        !html.contains(">Resolve done<"),
        "resolved: nothing left to resolve"
    );
    assert!(html.contains("resolved failed by an operator"), "{html}");
}

on_both_backends!(
    an_operator_resolves_an_unknown_outcome_done_or_failed,
    the_console_resolves_an_unknown_outcome,
    a_crash_during_an_at_most_once_call_leaves_it_unknown_never_called_again,
    a_crash_after_an_at_most_once_call_before_its_record_leaves_it_unknown,
    a_crash_before_an_at_most_once_call_is_sent_calls_it_once,
    a_takeover_waits_for_the_retry_a_connector_asked_for,
);
