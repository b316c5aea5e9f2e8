//! Pipeline v2's promises, each a fault the v1 pipeline had: a signal is decided once, and that
//! decision is what every retry, takeover and callback sees.

use std::time::Duration;

use crate::common;
use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, Server, TestDb, new_key, sim_swap};

/// What a fresh SIM swap gets from the default playbook.
const FRESH_SIM_SWAP_ACTIONS: [&str; 5] = [
    "lock_account",
    "open_case",
    "alert_customer",
    "deny",
    "callback",
];

/// Asserts a reply is the decision a fresh SIM swap gets, every action done by this event.
fn assert_fresh_decision(reply: &common::Reply) {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let json = reply.json();
    assert_eq!(json["decision"], "deny");
    assert_eq!(json["rule"], "recent_sim_swap", "{json}");
    assert_eq!(json["playbook_version"], 0);
    let actions: Vec<_> = json["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    let expected: Vec<_> = FRESH_SIM_SWAP_ACTIONS
        .iter()
        .map(|a| (*a, "done"))
        .collect();
    assert_eq!(actions, expected);
}

/// Sends a keyed signal without waiting for its answer.
fn send_in_background(
    server: &Server,
    tenant: &common::Tenant,
    key: &str,
    body: &str,
) -> tokio::task::JoinHandle<common::Reply> {
    let req = common::signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        tenant,
        Some(key),
        body,
        common::now(),
    );
    tokio::spawn(async move { common::Reply::from(req.send().await.unwrap()).await })
}

/// Retries a keyed signal until it is no longer in progress.
async fn send_until_decided(
    server: &Server,
    tenant: &common::Tenant,
    key: &str,
    body: &str,
) -> common::Reply {
    let mut reply = server.send(tenant, Some(key), body).await;
    for _ in 0..50 {
        if reply.status != 409 && reply.status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        reply = server.send(tenant, Some(key), body).await;
    }
    reply
}

/// Settings of every server in these tests: a short lock and callbacks to loopback.
const ENV: [(&str, &str); 2] = [
    ("VERDICT_LOCK_TIMEOUT_SECS", "1"),
    ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
];

/// Sends a keyed signal to a server that aborts where `failpoints` say (the `fail` crate's
/// syntax), then starts a fresh one.
async fn crash_then_restart(
    db: &TestDb,
    tenant: &common::Tenant,
    key: &str,
    body: &str,
    failpoints: &str,
) -> Server {
    crash_then_restart_after(db, tenant, key, body, failpoints, || {}).await
}

/// As [`crash_then_restart`], running `meanwhile` while no server is up.
async fn crash_then_restart_after(
    db: &TestDb,
    tenant: &common::Tenant,
    key: &str,
    body: &str,
    failpoints: &str,
    meanwhile: impl FnOnce(),
) -> Server {
    let mut doomed_env = ENV.to_vec();
    doomed_env.push(("FAILPOINTS", failpoints));
    let doomed = Server::start(db, &doomed_env);
    doomed.send_raw_expecting_crash(tenant, key, body).await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted at {failpoints}"
    );
    meanwhile();
    Server::start(db, &ENV)
}

async fn retry_after_a_transient_failure_mid_effects_gets_the_fresh_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(
        &db,
        &[
            ("FAILPOINTS", "act::after_lock_account=1*return"),
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
        ],
    );
    let key = new_key();
    let body = sim_swap("+447700900301");

    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 503);
    let retried = server.send(&tenant, Some(&key), &body).await;
    assert_fresh_decision(&retried);
    assert_eq!(
        db.count("alert_windows").await,
        1,
        "the customer is alerted"
    );
    assert_eq!(db.count("events").await, 1);
}

async fn retry_after_a_crash_mid_effects_gets_the_fresh_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let key = new_key();
    let body = sim_swap("+447700900302");
    let server = crash_then_restart(
        &db,
        &tenant,
        &key,
        &body,
        "act::after_lock_account=return(abort)",
    )
    .await;
    for table in ["idempotency_keys", "account_locks"] {
        assert_eq!(
            db.count(table).await,
            0,
            "a fresh key's claim rolls back with its effects: nothing in {table}"
        );
    }
    let reply = send_until_decided(&server, &tenant, &key, &body).await;
    assert_fresh_decision(&reply);
    assert_eq!(db.count("alert_windows").await, 1);
}

async fn a_takeover_after_a_crash_mid_effects_gets_the_fresh_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let key = new_key();
    let body = sim_swap("+447700900304");
    // The first commit fails for good, so the claim commits on its own; the crash in the act
    // under it (its first pass through the failpoint is the failed commit's) leaves it in
    // flight.
    let server = crash_then_restart(
        &db,
        &tenant,
        &key,
        &body,
        "act::before_commit=1*return(permanent);act::after_lock_account=1*off->return(abort)",
    )
    .await;
    assert_eq!(db.count("idempotency_keys").await, 1, "the claim survived");
    let reply = send_until_decided(&server, &tenant, &key, &body).await;
    assert_fresh_decision(&reply);
    assert!(
        server
            .logged("took over an abandoned idempotency key")
            .await
    );
    assert_eq!(db.count("alert_windows").await, 1);
}

async fn a_takeover_uses_the_recorded_decision_not_a_newer_playbook(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let key = new_key();
    let body = sim_swap("+447700900303");
    // A newer playbook that would allow everything, published while the key is abandoned.
    let allow_all = "[[rule]]\nname = \"allow_all\"\ndecision = \"allow\"\nactions = []\n";
    let crash_after_claim =
        "act::before_commit=1*return(permanent);ingest::after_claim=return(abort)";
    let server = crash_then_restart_after(&db, &tenant, &key, &body, crash_after_claim, || {
        db.set_playbook(&tenant, allow_all);
    })
    .await;
    let reply = send_until_decided(&server, &tenant, &key, &body).await;
    assert_fresh_decision(&reply);
    // A new signal does get the new playbook.
    let other = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900313"))
        .await;
    assert_eq!(other.json()["rule"], "allow_all");
}

async fn a_holder_that_overruns_its_lock_finishes_once_and_the_taker_gets_its_answer(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    // The holder stalls inside its commit for longer than its lock.
    let server = Server::start(
        &db,
        &[
            ("VERDICT_LOCK_TIMEOUT_SECS", "1"),
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("FAILPOINTS", "act::after_deny=1*return(delay_ms=2500)"),
        ],
    );
    let key = new_key();
    let body = sim_swap("+447700900304");
    let holder = send_in_background(&server, &tenant, &key, &body);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let taker = send_until_decided(&server, &tenant, &key, &body).await;
    let holder = holder.await.unwrap();
    assert_fresh_decision(&holder);
    assert_eq!(taker.status, 200);
    assert_eq!(taker.body, holder.body, "one decision, one response");
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("deliveries").await, 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "one inline callback");
    assert_eq!(db.count("delivery_attempts").await, 1, "and it is recorded");
}

async fn a_lock_timeout_below_one_second_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("VERDICT_DATABASE_URL", &db.url)
        .env("VERDICT_MASTER_KEY", &db.master_key)
        .env("VERDICT_LOCK_TIMEOUT_SECS", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lock timeout"), "{stderr}");
}

async fn a_keyed_callback_names_an_event_that_is_already_stored(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The receiver holds the inline attempt long enough to look while it is in flight.
    let receiver = Receiver::start(vec![Step::slow(204, Duration::from_millis(1500))]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let key = new_key();
    let body = sim_swap("+447700900305");
    let request = send_in_background(&server, &tenant, &key, &body);
    for _ in 0..100 {
        if !receiver.received().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let callback = receiver
        .received()
        .pop()
        .expect("the inline callback arrives");
    let event_id = callback.json()["event_id"].as_str().unwrap().to_owned();
    let looked_up = server.get(&tenant, &format!("/v1/events/{event_id}")).await;
    assert_eq!(
        looked_up.status, 200,
        "the callback's event is stored before it is sent"
    );
    assert_eq!(request.await.unwrap().status, 200);
}

/// A keyed SIM swap about `phone`, signed, sent with `request_id` as its `x-request-id`.
fn swap_with_request_id(
    server: &Server,
    tenant: &common::Tenant,
    phone: &str,
    request_id: &str,
) -> reqwest::RequestBuilder {
    common::signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        tenant,
        Some(&new_key()),
        &sim_swap(phone),
        common::now(),
    )
    .header("x-request-id", request_id)
}

async fn the_inline_attempt_logs_carry_the_request_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let req = swap_with_request_id(&server, &tenant, "+447700900306", "req-inline-7");
    assert_eq!(req.send().await.unwrap().status(), 200);
    // Logged once recorded, which may be just after the response.
    assert!(
        server.logged("delivery attempted").await,
        "the inline attempt is logged"
    );
    let logs = server.logs();
    let attempt = logs
        .lines()
        .find(|l| l.contains("delivery attempted"))
        .expect("the inline attempt is logged");
    assert!(attempt.contains("req-inline-7"), "{attempt}");
}

/// A fresh signal's request logs one line, its response's, and that line names the event it
/// recorded and its decision.
async fn the_response_line_carries_the_signals_event_and_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900307"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = reply.json();
    let event_id = reply["event_id"].as_str().unwrap();
    let logs = server.logs();
    let response = logs
        .lines()
        .find(|l| l.contains("finished processing request") && l.contains(event_id))
        .unwrap_or_else(|| panic!("the response's line names the event: {logs}"));
    // The tests' servers log JSON: the request's span, with what was recorded on it.
    let line: serde_json::Value = serde_json::from_str(response).expect("a JSON log line");
    assert_eq!(line["span"]["event_id"], event_id, "{line}");
    assert_eq!(line["span"]["decision"], reply["decision"], "{line}");
    assert!(
        !logs.contains("signal decided"),
        "no line of the decision's own: {logs}"
    );
}

/// With the response's line filtered out, the decision is logged on a line of its own.
async fn without_the_response_line_the_decision_has_a_line_of_its_own(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_LOG", "info,sqlx=warn,tower_http=warn")]);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900308"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    assert!(
        server.logged("signal decided").await,
        "the decision is logged: {}",
        server.logs()
    );
    let logs = server.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("signal decided"))
        .unwrap_or_default();
    assert!(line.contains(&event_id), "{line}");
    assert!(!logs.contains("finished processing request"), "{logs}");
}

/// A client that goes away while its signal's inline callback is still out (the receiver takes
/// 3 s) does not take the decision's log line with it.
async fn a_client_that_goes_away_mid_request_leaves_its_decision_logged(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::slow(204, Duration::from_secs(3))]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let req = swap_with_request_id(&server, &tenant, "+447700900309", "req-gone-9")
        .timeout(Duration::from_millis(500));
    assert!(req.send().await.is_err(), "the client gave up first");
    // Logged when the server drops the request, or with its response once the attempt ends.
    let decided = |logs: &str| {
        logs.lines().any(|l| {
            l.contains("req-gone-9")
                && (l.contains("signal decided")
                    || (l.contains("finished processing request") && l.contains("\"decision\"")))
        })
    };
    for _ in 0..100 {
        if decided(&server.logs()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the decision was never logged: {}", server.logs());
}

on_both_backends!(
    the_response_line_carries_the_signals_event_and_decision,
    without_the_response_line_the_decision_has_a_line_of_its_own,
    a_client_that_goes_away_mid_request_leaves_its_decision_logged,
    retry_after_a_transient_failure_mid_effects_gets_the_fresh_decision,
    retry_after_a_crash_mid_effects_gets_the_fresh_decision,
    a_takeover_after_a_crash_mid_effects_gets_the_fresh_decision,
    a_takeover_uses_the_recorded_decision_not_a_newer_playbook,
    a_holder_that_overruns_its_lock_finishes_once_and_the_taker_gets_its_answer,
    a_lock_timeout_below_one_second_is_refused,
    a_keyed_callback_names_an_event_that_is_already_stored,
    the_inline_attempt_logs_carry_the_request_id,
);

/// PostgreSQL only: a batch committed alone cannot be sent again on another connection, so the
/// pipeline's connections that the database closed while they were idle (a restart, an idle
/// timeout) must be found and replaced before a batch goes out on one, not answered with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_closed_while_idle_are_replaced_before_the_next_batch() {
    let db = TestDb::new(Backend::Postgres).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900601"))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());

    let closed = db
        .exec(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .await;
    assert!(closed > 0, "the server's connections were closed");
    // Idle for longer than the pipeline pool's ping threshold (1 s).
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    for n in 0..5 {
        let phone = format!("+44770090061{n}");
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(&phone))
            .await;
        assert_eq!(reply.status, 200, "signal {n}: {}", reply.text());
        assert_eq!(reply.json()["rule"], "recent_sim_swap", "{}", reply.text());
    }
    assert_eq!(db.count("events").await, 6);
}

/// PostgreSQL only: no statement is compiled with JIT, on either pool. Its cost is paid at
/// every execution and its trigger is an estimate that grows with the tables, so a statement
/// that reads nothing took 20 ms more once the events table held a million rows.
#[tokio::test]
async fn no_connection_compiles_statements_with_jit() {
    let db = TestDb::new(Backend::Postgres).await;
    let store = verdict::store::PostgresStore::connect(&db.url)
        .await
        .expect("the store connects");
    for (pool, name) in [(store.read(), "main"), (store.decisions(), "pipeline")] {
        let jit: String = sqlx::query_scalar("SHOW jit")
            .fetch_one(pool)
            .await
            .expect("a connection answers");
        assert_eq!(jit, "off", "the {name} pool");
    }
}
