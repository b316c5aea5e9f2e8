//! The way back (unlock, lift a deny, close a case) under an `Idempotency-Key`: the same key and
//! body answer as the first request did and do nothing again, another body is 422, and the
//! connector call it makes is not cancelled by a client that goes away. Counted on the
//! connector's endpoint itself. And what a way back reads of its subject: every event about it,
//! whatever day it was stored.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::receiver::{Receiver, Step};
use crate::common::{
    Backend, Reply, Server, Tenant, TestDb, action_outcome, assert_problem, new_key,
};

const ALLOW_LOCAL: (&str, &str) = ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1");

/// A SIM swap about `account`, observed an hour ago.
fn swap(account: &str) -> String {
    swap_observed(account, time::Duration::hours(1))
}

/// A SIM swap about `account`, observed `ago`.
fn swap_observed(account: &str, ago: time::Duration) -> String {
    let observed = time::OffsetDateTime::now_utc() - ago;
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({"type": "sim_swap", "subject": {"account": account}, "observed_at": observed})
        .to_string()
}

/// Binds `lock_account` (so `unlock_account` too) to an HTTP connector at `url`, and denies
/// and opens a case unbound.
fn bind_idp(db: &TestDb, tenant: &Tenant, url: &str) {
    db.cli(&[
        "connector",
        "set",
        "--tenant",
        &tenant.id,
        "--name",
        "idp",
        "--kind",
        "http",
        "--url",
        url,
    ]);
    db.set_playbook(
        tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["lock_account", "open_case", "deny"]

[actions.lock_account]
connector = "idp"
"#,
    );
}

/// Posts a way back's body (as raw text, so a test can reorder it) with an optional key.
async fn way_back(
    server: &Server,
    tenant: &Tenant,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> Reply {
    let mut req = server
        .client
        .post(format!("{}/v1/subjects/{path}", server.base))
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    Reply::from(req.send().await.unwrap()).await
}

/// The unlock requests the connector got.
fn unlocks(endpoint: &Receiver) -> usize {
    endpoint
        .received()
        .iter()
        .filter(|r| r.json()["action"] == "unlock_account")
        .count()
}

async fn a_way_back_under_an_idempotency_key_is_taken_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let endpoint = Receiver::start(Vec::new()).await;
    endpoint.answer_by_default(Step::status(204));
    bind_idp(&db, &tenant, &endpoint.url);
    let server = Server::start(&db, &[ALLOW_LOCAL]);
    let locked = server.send(&tenant, Some(&new_key()), &swap("luca")).await;
    assert_eq!(
        action_outcome(&locked.json(), "lock_account")["outcome"],
        "done"
    );

    let key = "unlock-7f3a9c1e-operator-key";
    let body = r#"{"subject": {"account": "luca"}, "reason": "verified in branch"}"#;
    // Refused before the claim, so the key is not taken: a read key, a body that is not one.
    let forbidden = way_back(&server, &reader, "unlock", Some(key), body).await;
    assert_problem(&forbidden, 403, "a read key");
    let invalid = way_back(&server, &tenant, "unlock", Some(key), r#"{"subject": {}}"#).await;
    assert_problem(&invalid, 400, "no subject");
    let blank = r#"{"subject": {"account": "luca"}, "reason": " "}"#;
    assert_problem(
        &way_back(&server, &tenant, "unlock", Some(key), blank).await,
        400,
        "a blank reason",
    );
    // Malformed keys, as for signals.
    for (bad, what) in [
        ("has space", "a key with a space"),
        ("\"unterminated", "a bad quoted string"),
        ("", "an empty key"),
    ] {
        let refused = way_back(&server, &tenant, "unlock", Some(bad), body).await;
        assert_problem(&refused, 400, what);
    }
    let long = "k".repeat(256);
    assert_problem(
        &way_back(&server, &tenant, "unlock", Some(&long), body).await,
        400,
        "a key of 256 characters",
    );
    let twice = server
        .client
        .post(format!("{}/v1/subjects/unlock", server.base))
        .bearer_auth(&tenant.api_key)
        .header("idempotency-key", key)
        .header("idempotency-key", "other")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), 400, "the header sent twice");
    assert_eq!(unlocks(&endpoint), 0, "nothing refused called anything");

    let first = way_back(&server, &tenant, "unlock", Some(key), body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    let undone = first.json();
    assert_eq!(undone["outcome"], "done", "{undone}");
    assert_eq!(undone["connector"], "idp");
    assert_eq!(unlocks(&endpoint), 1);
    let events = db.count("events").await;

    // The same key and body (another key order, other whitespace, the quoted form of the key):
    // the stored answer, nothing done again.
    let reordered = "{ \"reason\":\"verified in branch\",\n \"subject\":{\"account\":\"luca\"} }";
    for (sent, form) in [(key.to_owned(), "bare"), (format!("\"{key}\""), "quoted")] {
        let again = way_back(&server, &tenant, "unlock", Some(&sent), reordered).await;
        assert_eq!(again.status, 200, "{form}: {}", again.text());
        assert!(again.replayed(), "{form}: replayed");
        assert_eq!(
            again.header("content-type"),
            Some("application/json"),
            "{form}"
        );
        assert_eq!(again.json(), undone, "{form}: the same answer");
    }
    assert_eq!(unlocks(&endpoint), 1, "not called again");
    assert_eq!(db.count("events").await, events, "not recorded again");

    // The same key with another body: 422, nothing done.
    let other = r#"{"subject": {"account": "luca"}, "reason": "another reason"}"#;
    let reused = way_back(&server, &tenant, "unlock", Some(key), other).await;
    let problem = assert_problem(&reused, 422, "the key with another body");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("/idempotency-key-reused"),
        "{problem}"
    );
    assert_eq!(unlocks(&endpoint), 1);

    // Keys are per way back: the same key lifts the deny, once.
    let lifted = way_back(&server, &tenant, "lift-deny", Some(key), body).await;
    assert_eq!(lifted.status, 200, "{}", lifted.text());
    assert!(!lifted.replayed());
    assert_eq!(lifted.json()["outcome"], "done");
    let lifted_again = way_back(&server, &tenant, "lift-deny", Some(key), body).await;
    assert!(lifted_again.replayed());
    assert_eq!(lifted_again.json(), lifted.json());

    // Another key, the same body: nothing left to undo (the way back is idempotent anyway).
    let fresh = way_back(&server, &tenant, "unlock", Some(&new_key()), body).await;
    assert_eq!(fresh.status, 200);
    assert!(!fresh.replayed());
    assert_eq!(fresh.json()["outcome"], "already_done");
    // A key replays its first answer, not the state now.
    let close_key = new_key();
    let closed = way_back(&server, &tenant, "close-case", Some(&close_key), body).await;
    assert_eq!(closed.json()["outcome"], "done", "the case was open");
    let nothing = way_back(&server, &tenant, "close-case", Some(&new_key()), body).await;
    assert_eq!(nothing.json()["outcome"], "already_done");
    let replayed = way_back(&server, &tenant, "close-case", Some(&close_key), body).await;
    assert!(replayed.replayed());
    assert_eq!(
        replayed.json()["outcome"],
        "done",
        "the first answer, not the state now"
    );

    // The CLI sends a key too: `--idempotency-key` twice answers once.
    let locked = server
        .send(&tenant, Some(&new_key()), &swap("luca"))
        .await
        .json();
    assert_eq!(action_outcome(&locked, "lock_account")["outcome"], "done");
    let cli = |key: Option<&str>| {
        let mut args = vec![
            "subject",
            "unlock",
            "--tenant",
            &tenant.id,
            "--account",
            "luca",
            "--reason",
            "verified by phone",
            "--json",
        ];
        if let Some(key) = key {
            args.extend(["--idempotency-key", key]);
        }
        serde_json::from_str::<Value>(&db.cli(&args)).unwrap()
    };
    let by_cli = cli(Some("cli-unlock-2b1d"));
    assert_eq!(by_cli["outcome"], "done", "{by_cli}");
    assert_eq!(unlocks(&endpoint), 2);
    assert_eq!(cli(Some("cli-unlock-2b1d")), by_cli, "the stored answer");
    assert_eq!(unlocks(&endpoint), 2, "not called again");
    assert_eq!(
        cli(None)["outcome"],
        "already_done",
        "a fresh key by default"
    );
    let bad = db.cli_output(
        &[
            "subject",
            "unlock",
            "--tenant",
            &tenant.id,
            "--account",
            "luca",
            "--reason",
            "r",
            "--idempotency-key",
            "has space",
        ],
        &[],
    );
    assert!(!bad.status.success(), "a malformed key");

    // Keys and identifiers are stored only as keyed digests, and never logged.
    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    for raw in [key, "cli-unlock-2b1d", "luca"] {
        assert!(!dump.contains(raw), "{raw} is stored");
    }
    let logs = server.logs();
    assert!(
        !logs.contains(key) && !logs.contains("luca"),
        "a key or identifier logged"
    );
}

/// The connector answers the unlock slowly; the client gives up (its connection closes) before
/// it does. The call goes on: it is recorded, the key is completed with its outcome, and the
/// client's retry with the key gets that answer. A retry while the call is out is 409.
async fn a_client_that_goes_away_does_not_cancel_the_way_backs_call(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    // The lock at once; the unlock after 1.5 s.
    let endpoint = Receiver::start(vec![
        Step::status(204),
        Step::slow(204, Duration::from_millis(1500)),
    ])
    .await;
    bind_idp(&db, &tenant, &endpoint.url);
    let server = Server::start(&db, &[ALLOW_LOCAL, ("VERDICT_NO_WORKER", "1")]);
    let locked = server.send(&tenant, Some(&new_key()), &swap("mila")).await;
    assert_eq!(
        action_outcome(&locked.json(), "lock_account")["outcome"],
        "done"
    );

    let key = new_key();
    let body = r#"{"subject": {"account": "mila"}, "reason": "verified in branch"}"#;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(400))
        .build()
        .unwrap();
    let gave_up = impatient
        .post(format!("{}/v1/subjects/unlock", server.base))
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body)
        .send()
        .await;
    assert!(gave_up.is_err(), "the client gave up before the answer");
    let busy = way_back(&server, &tenant, "unlock", Some(&key), body).await;
    assert_problem(&busy, 409, "the same key while its call is out");
    assert!(busy.header("retry-after").is_some());

    // The call ends and is recorded although no one waits for it.
    let mut request = Value::Null;
    for _ in 0..100 {
        let page = server.get(&tenant, "/v1/deliveries").await.json();
        request = page["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["action"] == "unlock_account")
            .cloned()
            .unwrap_or(Value::Null);
        if request["status"] != "pending" && !request.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(request["status"], "succeeded", "{request}");
    assert_eq!(request["attempts"], 1, "{request}");
    assert_eq!(unlocks(&endpoint), 1);

    // The retry gets the call's outcome, stored on the key.
    let mut retry = way_back(&server, &tenant, "unlock", Some(&key), body).await;
    for _ in 0..50 {
        if retry.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        retry = way_back(&server, &tenant, "unlock", Some(&key), body).await;
    }
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(retry.replayed());
    let undone = retry.json();
    assert_eq!(undone["outcome"], "done", "{undone}");
    let event = server
        .event(&tenant, undone["event_id"].as_str().unwrap())
        .await;
    assert_eq!(action_outcome(&event, "unlock_account")["outcome"], "done");
    assert_eq!(unlocks(&endpoint), 1, "called once");
}

/// Moves the event `id` `days` back in time, as if stored then.
async fn store_days_ago(db: &TestDb, id: &Value, days: i64) {
    let id = id.as_str().unwrap().parse().unwrap();
    let moved = db
        .exec(format!(
            "UPDATE events SET created_at = created_at - {} WHERE id = {}",
            days * 86_400_000,
            db.uuid_sql(id)
        ))
        .await;
    assert_eq!(moved, 1);
}

/// A lock call still waiting for its retry would undo the unlock once retried: the way back
/// fails it, whichever day the signal that made it was stored.
async fn a_way_back_fails_the_waiting_lock_call_of_a_signal_stored_days_ago(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let endpoint = Receiver::start(vec![Step::status(503)]).await;
    endpoint.answer_by_default(Step::status(204));
    bind_idp(&db, &tenant, &endpoint.url);
    // No worker: the refused lock call waits for a retry that only the way back can meet.
    let server = Server::start(&db, &[ALLOW_LOCAL, ("VERDICT_NO_WORKER", "1")]);
    let locked = server
        .send(&tenant, Some(&new_key()), &swap("mina"))
        .await
        .json();
    assert_eq!(
        action_outcome(&locked, "lock_account")["outcome"],
        "pending",
        "{locked}"
    );
    store_days_ago(&db, &locked["event_id"], 3).await;

    let body = r#"{"subject": {"account": "mina"}, "reason": "verified in branch"}"#;
    let unlocked = way_back(&server, &tenant, "unlock", None, body).await;
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
    assert_eq!(unlocked.json()["outcome"], "done", "{}", unlocked.text());
    let event = server
        .event(&tenant, locked["event_id"].as_str().unwrap())
        .await;
    let lock = &action_outcome(&event, "lock_account")["outcome"];
    assert!(
        lock.as_str()
            .is_some_and(|o| o.starts_with("failed: superseded by an operator's way back")),
        "{event}"
    );
    assert_eq!(event["deliveries"][0]["status"], "failed", "{event}");
}

/// A subject's page lists its events newest first, however many days apart they were stored,
/// and only its own.
async fn a_subjects_page_lists_its_events_from_every_day_newest_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &[]);
    let mut events = Vec::new();
    for (minutes_ago, days_ago) in [(30, 40), (20, 1), (10, 0)] {
        let signal = swap_observed("noor", time::Duration::minutes(minutes_ago));
        let reply = server.send(&tenant, Some(&new_key()), &signal).await.json();
        store_days_ago(&db, &reply["event_id"], days_ago).await;
        events.push(reply);
    }
    let other = server
        .send(&tenant, Some(&new_key()), &swap("omar"))
        .await
        .json();
    assert_ne!(other["subject_hash"], events[0]["subject_hash"]);

    let hash = events[0]["subject_hash"].as_str().unwrap();
    let page = server.get(&tenant, &format!("/v1/subjects/{hash}")).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let listed = page.json()["events"].clone();
    let newest_first: Vec<&Value> = events.iter().rev().map(|e| &e["event_id"]).collect();
    assert_eq!(listed, json!(newest_first));
}

on_both_backends!(
    a_way_back_under_an_idempotency_key_is_taken_once,
    a_client_that_goes_away_does_not_cancel_the_way_backs_call,
    a_way_back_fails_the_waiting_lock_call_of_a_signal_stored_days_ago,
    a_subjects_page_lists_its_events_from_every_day_newest_first,
);
