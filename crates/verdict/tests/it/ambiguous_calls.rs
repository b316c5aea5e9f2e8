//! Calls whose outcome is open: a retry that takes a key over waits for the retry a connector
//! asked for. Counted on the receiving endpoint itself.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::receiver::{Receiver, Step};
use crate::common::{
    Backend, Server, Tenant, TestDb, action_outcome, new_key, until_not_in_progress,
};

const ALLOW_LOCAL: (&str, &str) = ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1");
/// A dead holder's lock runs out at once.
const LOCK: (&str, &str) = ("VERDICT_LOCK_TIMEOUT_SECS", "1");
/// No worker: the retry of the signal finishes the calls.
const NO_WORKER: (&str, &str) = ("VERDICT_NO_WORKER", "1");

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

on_both_backends!(a_takeover_waits_for_the_retry_a_connector_asked_for,);
