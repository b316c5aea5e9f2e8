//! Actions that act: a bound action calls the tenant's own system once per event, through a
//! crash at any point around the call, counted on the receiving systems themselves (a real SCIM
//! server's users, an HTTP endpoint that deduplicates on `Idempotency-Key`).

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::effects::{EffectReceiver, SCIM_TOKEN, ScimServer};
use crate::common::{
    Backend, Server, Tenant, TestDb, action_outcome as outcome, new_key, now, post_json as post,
};

/// A SIM swap about an account, observed an hour ago.
fn swap_of_account(account: &str) -> String {
    let observed = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({
        "type": "sim_swap",
        "subject": {"account": account},
        "observed_at": observed,
        "attributes": {},
        "metadata": {"case_ref": "r-1"},
    })
    .to_string()
}

/// Binds `lock_account` to a SCIM connector `idp` and `open_case`, `alert_customer` to an HTTP
/// connector `cases`; returns the HTTP connector's signing secret.
async fn bind_connectors(db: &TestDb, tenant: &Tenant, scim: &ScimServer, http: &str) -> String {
    let token = db.dir().join("scim-token");
    std::fs::write(&token, SCIM_TOKEN).unwrap();
    let set = |args: &[&str]| {
        let mut all = vec!["connector", "set", "--tenant", &tenant.id, "--json"];
        all.extend_from_slice(args);
        db.cli(&all)
    };
    set(&[
        "--name",
        "idp",
        "--kind",
        "scim",
        "--url",
        &scim.base,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    let cases: Value =
        serde_json::from_str(&set(&["--name", "cases", "--kind", "http", "--url", http])).unwrap();
    db.set_playbook(
        tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["lock_account", "open_case", "alert_customer", "deny", "callback"]

[actions.lock_account]
connector = "idp"

[actions.open_case]
connector = "cases"

[actions.alert_customer]
connector = "cases"
"#,
    );
    cases["secret"].as_str().unwrap().to_owned()
}

const ENV: [(&str, &str); 1] = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")];

async fn bound_actions_act_on_the_tenants_systems_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let scim = ScimServer::start().await;
    let http = EffectReceiver::start(Duration::ZERO).await;
    let secret = bind_connectors(&db, &tenant, &scim, &http.url).await;
    let alice = scim.create_user("alice", "acct-alice", true).await;
    let server = Server::start(&db, &ENV);

    let body = swap_of_account("alice");
    let reply = server.send(&tenant, Some(&new_key()), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let decided = reply.json();
    assert_eq!(outcome(&decided, "lock_account")["outcome"], "done");
    assert_eq!(outcome(&decided, "lock_account")["connector"], "idp");
    assert_eq!(outcome(&decided, "open_case")["outcome"], "done");
    assert_eq!(outcome(&decided, "alert_customer")["connector"], "cases");
    assert!(
        outcome(&decided, "deny").get("connector").is_none(),
        "an unbound action says it is a local record"
    );
    assert_eq!(scim.user(&alice).await["active"], false);
    let deactivated = scim.version(&alice).await;

    let event_id = decided["event_id"].as_str().unwrap();
    let calls = http.calls();
    assert_eq!(calls.len(), 2, "one request per bound action");
    for call in &calls {
        let request = call.json();
        let key = format!("{event_id}:{}", request["action"].as_str().unwrap());
        assert_eq!(call.header("idempotency-key"), key);
        assert_eq!(call.header("webhook-id"), key);
        assert_eq!(request["subject"]["account"], "alice");
        assert_eq!(request["decision"], "deny");
        assert_eq!(request["metadata"]["case_ref"], "r-1");
        // Signed per Standard Webhooks with the connector's own secret.
        let verified = verdict_webhooks::Verifier::new(vec![
            verdict_webhooks::Secret::parse(&secret).unwrap(),
        ])
        .verify(
            &verdict_webhooks::Headers::from_http(&call.headers).unwrap(),
            &call.body,
            now(),
        );
        assert!(verified.is_ok(), "{verified:?}");
    }

    // The same signal again, under a new key: the lock is held, so nothing is called again.
    let again = server.send(&tenant, Some(&new_key()), &body).await.json();
    assert_eq!(outcome(&again, "lock_account")["outcome"], "already_done");
    assert_eq!(scim.version(&alice).await, deactivated, "not written again");
    assert_eq!(http.calls().len(), 2, "not called again");

    // A user already inactive in the identity provider: already done there.
    let bob = scim.create_user("bob", "acct-bob", false).await;
    let created = scim.version(&bob).await;
    let bobs = server
        .send(&tenant, Some(&new_key()), &swap_of_account("bob"))
        .await
        .json();
    assert_eq!(outcome(&bobs, "lock_account")["outcome"], "already_done");
    assert_eq!(scim.version(&bob).await, created, "never written");

    // No user to lock: a terminal failure that says so.
    let nobody = server
        .send(&tenant, Some(&new_key()), &swap_of_account("carol"))
        .await
        .json();
    let failed = outcome(&nobody, "lock_account")["outcome"]
        .as_str()
        .unwrap();
    assert!(
        failed.starts_with("failed: no SCIM user's userName matches"),
        "{failed}"
    );

    // Once every action is final, no raw identifier is left in the database.
    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    for raw in ["alice", "acct-alice", "carol"] {
        assert!(!dump.contains(raw), "{raw} is stored");
    }
    let logs = server.logs();
    assert!(
        !logs.contains("\"alice\"") && !logs.contains("carol"),
        "identifiers logged"
    );
}

async fn a_refusing_connector_fails_its_action_and_the_event_shows_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let scim = ScimServer::start().await;
    let http = EffectReceiver::start(Duration::ZERO).await;
    bind_connectors(&db, &tenant, &scim, &http.url).await;
    http.refuse_with(400);
    let server = Server::start(&db, &ENV);
    let reply = server
        .send(&tenant, Some(&new_key()), &swap_of_account("dave"))
        .await
        .json();
    assert_eq!(
        outcome(&reply, "open_case")["outcome"],
        "failed: HTTP 400 Bad Request"
    );
    let event = server
        .event(&tenant, reply["event_id"].as_str().unwrap())
        .await;
    assert_eq!(
        outcome(&event, "open_case")["outcome"],
        "failed: HTTP 400 Bad Request"
    );
    let requests: Vec<&Value> = event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["action"] != "callback")
        .collect();
    assert_eq!(requests.len(), 3, "{event}");
    assert!(requests.iter().all(|d| d["connector"].is_string()));
}

/// Aborts the real binary at `failpoint` on a signal's first connector call, restarts it, and
/// retries with the same key until the dead holder's lock expires: every action final, each
/// effect applied once on the receiving systems.
async fn crash_at(backend: Backend, failpoint: &str) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let scim = ScimServer::start().await;
    // Slow enough that a crash 100 ms into the call meets it in flight.
    let http = EffectReceiver::start(Duration::from_millis(400)).await;
    bind_connectors(&db, &tenant, &scim, &http.url).await;
    let erin = scim.create_user("erin", "acct-erin", true).await;
    let key = new_key();
    let body = swap_of_account("erin");
    let lock = ("VERDICT_LOCK_TIMEOUT_SECS", "1");
    // A short deadline, so the dead holder's lease on its calls (deadline + 10 s) ends soon.
    let deadline = ("VERDICT_INLINE_DEADLINE_MS", "1000");
    // No worker: the retry of the signal is what finishes the calls here.
    let no_worker = ("VERDICT_NO_WORKER", "1");

    let failpoints = format!("{failpoint}=1*return(abort)");
    let doomed = Server::start(
        &db,
        &[
            ENV[0],
            lock,
            deadline,
            no_worker,
            ("FAILPOINTS", &failpoints),
        ],
    );
    doomed.send_raw_expecting_crash(&tenant, &key, &body).await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted at {failpoint}"
    );
    // If the crashed call already deactivated the user, nothing may write it again.
    let at_crash = scim.user(&erin).await;

    let server = Server::start(&db, &[ENV[0], lock, deadline, no_worker]);
    let mut reply = server.send(&tenant, Some(&key), &body).await;
    // 409 until the dead holder's lock, then its calls' lease (deadline + 15 s), run out.
    for _ in 0..150 {
        if reply.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        reply = server.send(&tenant, Some(&key), &body).await;
    }
    assert_eq!(reply.status, 200, "{}", reply.text());
    let decided = reply.json();
    for action in ["open_case", "alert_customer"] {
        assert_eq!(
            outcome(&decided, action)["outcome"],
            "done",
            "{action} after a crash at {failpoint}: {decided}"
        );
    }
    // A deactivation whose answer was lost is found done on the retry: naturally idempotent.
    let lock = outcome(&decided, "lock_account")["outcome"]
        .as_str()
        .unwrap();
    assert!(
        ["done", "already_done"].contains(&lock),
        "lock_account after a crash at {failpoint}: {decided}"
    );
    assert_eq!(scim.user(&erin).await["active"], false);
    if at_crash["active"] == false {
        assert_eq!(
            scim.user(&erin).await["meta"]["version"],
            at_crash["meta"]["version"],
            "deactivated once, never written again"
        );
    }
    let applied = http.applied();
    assert_eq!(
        applied.len(),
        2,
        "one effect per (event, action): {applied:?}"
    );
    let event_id = decided["event_id"].as_str().unwrap();
    let keys: std::collections::BTreeSet<String> = http
        .calls()
        .iter()
        .map(|c| c.header("idempotency-key").to_owned())
        .collect();
    assert_eq!(
        keys,
        [
            format!("{event_id}:alert_customer"),
            format!("{event_id}:open_case")
        ]
        .into(),
        "every attempt under the stored keys"
    );
    assert_eq!(db.count("events").await, 1);
    let replay = server.send(&tenant, Some(&key), &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.json(), decided);
    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    assert!(!dump.contains("acct-erin") && !dump.contains("\"erin\""));
}

async fn a_crash_before_the_call_calls_once(b: Backend) {
    crash_at(b, "connector::before_call").await
}

async fn a_crash_during_the_call_calls_once(b: Backend) {
    crash_at(b, "connector::during_call").await
}

async fn a_crash_after_the_call_before_its_record_calls_once(b: Backend) {
    crash_at(b, "connector::after_call").await
}

/// A SIM swap about an account, observed `minutes_ago` minutes ago: a signal of its own.
fn swap_of_account_at(account: &str, minutes_ago: i64) -> String {
    let observed = time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes_ago);
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    json!({
        "type": "sim_swap",
        "subject": {"account": account},
        "observed_at": observed,
    })
    .to_string()
}

async fn an_operator_finds_a_subject_and_takes_the_way_back(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let scim = ScimServer::start().await;
    let http = EffectReceiver::start(Duration::ZERO).await;
    bind_connectors(&db, &tenant, &scim, &http.url).await;
    let frank = scim.create_user("frank", "acct-frank", true).await;
    let server = Server::start(&db, &ENV);

    let first = server
        .send(&tenant, Some(&new_key()), &swap_of_account_at("frank", 60))
        .await
        .json();
    assert_eq!(outcome(&first, "lock_account")["outcome"], "done");
    assert_eq!(scim.user(&frank).await["active"], false);

    // Found by the account an analyst holds, with a read key.
    let found = post(
        &server,
        &reader,
        "/v1/subjects/lookup",
        json!({"account": "frank"}),
    )
    .await;
    assert_eq!(found.status, 200, "{}", found.text());
    let found = found.json();
    assert_eq!(found["subject_hash"], first["subject_hash"]);
    assert_eq!(found["lock"]["event_id"], first["event_id"]);
    assert_eq!(found["events"][0], first["event_id"]);
    let unknown = post(
        &server,
        &reader,
        "/v1/subjects/lookup",
        json!({"account": "nobody"}),
    )
    .await;
    assert_eq!(unknown.status, 404);

    let why = json!({"subject": {"account": "frank"}, "reason": "verified in branch"});
    let forbidden = post(&server, &reader, "/v1/subjects/unlock", why.clone()).await;
    assert_eq!(
        forbidden.status, 403,
        "only an admin key takes the way back"
    );
    for (body, what) in [
        (
            json!({"subject": {"account": "frank"}, "reason": ""}),
            "an empty reason",
        ),
        (
            json!({"subject": {"account": "frank"}, "reason": "x".repeat(501)}),
            "a reason of 501 characters",
        ),
        (
            json!({"subject": {"account": "frank", "phone": "+447700900123"}, "reason": "r"}),
            "two identifiers",
        ),
        (
            json!({"subject": {"phone": "12"}, "reason": "r"}),
            "a phone that is not E.164",
        ),
    ] {
        let refused = post(&server, &tenant, "/v1/subjects/unlock", body).await;
        assert_eq!(refused.status, 400, "{what}: {}", refused.text());
    }
    assert_eq!(
        scim.user(&frank).await["active"],
        false,
        "nothing unlocked yet"
    );

    // Unlocked here and in the identity provider, recorded as an event with who and why.
    let unlocked = post(&server, &tenant, "/v1/subjects/unlock", why.clone()).await;
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
    let unlocked = unlocked.json();
    assert_eq!(unlocked["outcome"], "done", "{unlocked}");
    assert_eq!(unlocked["connector"], "idp");
    assert_eq!(scim.user(&frank).await["active"], true);
    let active_again = scim.version(&frank).await;
    let event_id = unlocked["event_id"].as_str().unwrap();
    let event = server.event(&tenant, event_id).await;
    assert_eq!(event["type"], "operator.unlock_account");
    assert_eq!(event["decision"], "ignored");
    assert_eq!(event["metadata"]["reason"], "verified in branch");
    assert_eq!(event["actions"][0]["outcome"], "done", "{event}");

    // Again: nothing to unlock, nothing recorded, nothing called.
    let again = post(&server, &tenant, "/v1/subjects/unlock", why)
        .await
        .json();
    assert_eq!(again["outcome"], "already_done", "{again}");
    assert!(again["event_id"].is_null());
    assert_eq!(scim.version(&frank).await, active_again);

    // The next SIM swap is decided afresh: it locks the account (here and there) again.
    let second = server
        .send(&tenant, Some(&new_key()), &swap_of_account_at("frank", 30))
        .await
        .json();
    assert_eq!(
        outcome(&second, "lock_account")["outcome"],
        "done",
        "{second}"
    );
    assert_eq!(scim.user(&frank).await["active"], false);

    // Lift the deny and close the case the same way; a repeat is already done.
    for path in ["/v1/subjects/lift-deny", "/v1/subjects/close-case"] {
        let body = json!({"subject": {"account": "frank"}, "reason": "false positive"});
        let done = post(&server, &tenant, path, body.clone()).await.json();
        assert_eq!(done["outcome"], "done", "{path}: {done}");
        let again = post(&server, &tenant, path, body).await.json();
        assert_eq!(again["outcome"], "already_done", "{path}: {again}");
    }
    let state = post(
        &server,
        &reader,
        "/v1/subjects/lookup",
        json!({"account": "frank"}),
    )
    .await
    .json();
    assert!(
        state["deny"].is_null() && state["open_cases"] == json!([]),
        "{state}"
    );

    // The same from the CLI, the account read from stdin (out of `ps` and the shell history).
    let looked: Value = serde_json::from_str(&db.cli_with_stdin(
        &[
            "subject",
            "lookup",
            "--tenant",
            &tenant.id,
            "--account",
            "-",
            "--json",
        ],
        "frank\n",
    ))
    .unwrap();
    assert_eq!(looked["lock"], second["event_id"]);
    let unlocked: Value = serde_json::from_str(&db.cli(&[
        "subject",
        "unlock",
        "--tenant",
        &tenant.id,
        "--account",
        "frank",
        "--reason",
        "verified by phone",
        "--json",
    ]))
    .unwrap();
    assert_eq!(unlocked["outcome"], "done", "{unlocked}");
    assert_eq!(scim.user(&frank).await["active"], true);

    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    assert!(!dump.contains("frank"), "the account is stored");
    assert!(!server.logs().contains("frank"), "the account was logged");
}

/// A decision with connector calls changes its event's outcomes when they answer, so its
/// callback keeps the envelope's bytes (with the metadata, stored once there) and is sent as
/// built.
async fn a_callback_beside_connector_calls_keeps_its_envelope_and_the_event_its_metadata_there(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = crate::common::receiver::Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--no-inbound-signature", "--callback-url", &receiver.url]);
    let scim = ScimServer::start().await;
    let http = EffectReceiver::start(Duration::ZERO).await;
    bind_connectors(&db, &tenant, &scim, &http.url).await;
    scim.create_user("erin", "acct-erin", true).await;
    let server = Server::start(&db, &ENV);
    let reply = server
        .send(&tenant, Some(&new_key()), &swap_of_account("erin"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(outcome(&reply.json(), "callback")["outcome"], "done");

    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM deliveries WHERE action = 'callback' AND length(payload) > 0"
        )
        .await,
        1,
        "the callback keeps its bytes"
    );
    assert_eq!(
        db.scalar("SELECT COALESCE(SUM(LENGTH(metadata)), 0) FROM events")
            .await,
        0,
        "the metadata is stored once, in the callback's bytes"
    );
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let shown = server.event(&tenant, &event_id).await;
    assert_eq!(shown["metadata"]["case_ref"], "r-1");
    for _ in 0..50 {
        if !receiver.received().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = receiver.received();
    assert_eq!(sent.len(), 1);
    let envelope = sent[0].json();
    assert_eq!(envelope["event_id"], event_id.as_str());
    assert_eq!(envelope["metadata"]["case_ref"], "r-1");
    assert_eq!(
        outcome(&envelope, "lock_account")["outcome"],
        "pending",
        "built before the connector answered"
    );
    receiver.verify_all_with_python(&tenant.webhook_secret);
}

on_both_backends!(
    a_callback_beside_connector_calls_keeps_its_envelope_and_the_event_its_metadata_there,
    an_operator_finds_a_subject_and_takes_the_way_back,
    bound_actions_act_on_the_tenants_systems_once,
    a_refusing_connector_fails_its_action_and_the_event_shows_it,
    a_crash_before_the_call_calls_once,
    a_crash_during_the_call_calls_once,
    a_crash_after_the_call_before_its_record_calls_once,
);
