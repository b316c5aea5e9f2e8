//! The Idempotency-Key contract of `POST /v1/signals`, row by row of SPEC §3's state table,
//! over real sockets against the real binary, on both backends.

use std::time::Duration;

use crate::common;
use crate::common::{Backend, Server, TestDb, new_key, sim_swap};

async fn completed_key_replays_status_and_body_with_replayed_header(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900001");

    let first = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert!(!first.replayed());
    assert_eq!(first.json()["decision"], "deny");

    let again = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(again.status, 200);
    assert!(again.replayed());
    assert_eq!(
        again.body, first.body,
        "a replay is byte for byte the stored body"
    );
    assert_eq!(db.count("events").await, 1);
}

async fn a_completed_key_keeps_no_copy_of_its_answer_and_another_instance_replays_it(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--callback-url", common::UNUSED_CALLBACK]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900031");
    let first = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(first.status, 200, "{}", first.text());

    // The answer is its event's: the key row keeps neither its bytes nor the decision its
    // event holds.
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM idempotency_keys WHERE state = 'completed' \
             AND response_status = 200 AND response_body IS NULL AND ruling IS NULL"
        )
        .await,
        1
    );
    // Another instance has no cached answer: it renders it from the event, byte for byte.
    let other = Server::start(&db, &[]);
    let replay = other.send(&tenant, Some(&key), &body).await;
    assert_eq!(replay.status, 200, "{}", replay.text());
    assert!(replay.replayed());
    assert_eq!(
        replay.body, first.body,
        "a replay is byte for byte the answer"
    );
    assert_eq!(db.count("events").await, 1);
}

async fn retry_with_other_body_gets_422(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();

    let first = server
        .send(&tenant, Some(&key), &sim_swap("+447700900002"))
        .await;
    assert_eq!(first.status, 200);
    let other = server
        .send(&tenant, Some(&key), &sim_swap("+447700900003"))
        .await;
    assert_eq!(other.status, 422);
    assert_eq!(
        other.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        other.json()["type"],
        "https://verdict.dev/problems/idempotency-key-reused"
    );
    assert_eq!(db.count("events").await, 1);
}

async fn in_flight_key_gets_409_with_retry_after_then_the_result(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(
        &db,
        &[(
            "FAILPOINTS",
            "act::before_commit=1*return(permanent);ingest::after_claim=1*return(delay_ms=2500)",
        )],
    );
    let key = new_key();
    let body = sim_swap("+447700900004");

    let slow = {
        let (server_base, tenant, key, body) = (
            server.base.clone(),
            tenant.clone(),
            key.clone(),
            body.clone(),
        );
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let req = common::signed(
                client.post(format!("{server_base}/v1/signals")),
                &tenant,
                Some(&key),
                &body,
                common::now(),
            );
            common::Reply::from(req.send().await.unwrap()).await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;

    let busy = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(busy.status, 409);
    assert_eq!(busy.header("retry-after"), Some("2"));
    assert_eq!(
        busy.json()["type"],
        "https://verdict.dev/problems/request-in-progress"
    );

    let mismatch = server
        .send(&tenant, Some(&key), &sim_swap("+447700900005"))
        .await;
    assert_eq!(
        mismatch.status, 422,
        "another payload is refused even while in flight"
    );

    let first = slow.await.unwrap();
    assert_eq!(first.status, 200);
    let after = server.send(&tenant, Some(&key), &body).await;
    assert!(after.replayed());
    assert_eq!(after.body, first.body);
    assert_eq!(db.count("events").await, 1);
}

async fn abandoned_in_flight_key_is_taken_over_after_the_lock_expires(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let key = new_key();
    let body = sim_swap("+447700900006");
    let lock = [("VERDICT_LOCK_TIMEOUT_SECS", "2")];

    let doomed = Server::start(
        &db,
        &[
            lock[0],
            (
                "FAILPOINTS",
                "act::before_commit=1*return(permanent);ingest::after_claim=return(abort)",
            ),
        ],
    );
    doomed.send_raw_expecting_crash(&tenant, &key, &body).await;
    assert!(doomed.wait_for_crash());
    assert_eq!(
        db.count("idempotency_keys").await,
        1,
        "the claim survived the crash"
    );

    let server = Server::start(&db, &lock);
    let blocked = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(blocked.status, 409, "the dead holder's lock is still fresh");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    let taken = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(
        taken.status,
        200,
        "{}",
        String::from_utf8_lossy(&taken.body)
    );
    assert!(!taken.replayed());
    assert!(
        server
            .logged("took over an abandoned idempotency key")
            .await
    );
    assert_eq!(db.count("events").await, 1);
}

async fn crash_after_the_commit_replays_the_stored_response(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--callback-url", common::UNUSED_CALLBACK]);
    let key = new_key();
    let body = sim_swap("+447700900007");

    // Effects, outbox row, event and response commit together; then the process dies before
    // the inline attempt.
    let doomed = Server::start(
        &db,
        &[("FAILPOINTS", "ingest::after_dispatch=return(abort)")],
    );
    doomed.send_raw_expecting_crash(&tenant, &key, &body).await;
    assert!(doomed.wait_for_crash());
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys WHERE state = 'completed'")
            .await,
        1
    );
    assert_eq!(
        db.count("events").await,
        1,
        "the event is stored with its callback"
    );
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(db.count("delivery_attempts").await, 0);

    let server = Server::start(&db, &[]);
    let replay = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(
        replay.status,
        200,
        "{}",
        String::from_utf8_lossy(&replay.body)
    );
    assert!(replay.replayed(), "the stored response, not a second run");
    assert_eq!(replay.json()["rule"], "recent_sim_swap");
    // Every action done: the event stores their names, and the replay says each was done.
    let stored = db.text("SELECT actions FROM events").await;
    let replayed: Vec<String> = replay.json()["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(a["outcome"], "done", "{a}");
            a["action"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(replayed.join(","), stored);
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("account_locks").await, 1);
}

/// Sends a signal again after its 503: processed now with the fresh decision, stored once,
/// and replayed after that.
async fn retry_after_503_is_processed_then_replayed(
    db: &TestDb,
    server: &Server,
    tenant: &common::Tenant,
    key: &str,
    body: &str,
) {
    let retried = server.send(tenant, Some(key), body).await;
    assert_eq!(retried.status, 200);
    assert!(!retried.replayed());
    assert_eq!(retried.json()["rule"], "recent_sim_swap");
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("account_locks").await, 1);
    let replay = server.send(tenant, Some(key), body).await;
    assert!(replay.replayed(), "a 503 is never stored; the 200 is");
}

async fn transient_failure_of_a_fresh_key_stores_nothing_and_the_retry_decides_it(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("FAILPOINTS", "act::before_commit=1*return")]);
    let key = new_key();
    let body = sim_swap("+447700900009");

    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 503);
    assert_eq!(failed.header("retry-after"), Some("2"));
    for table in ["idempotency_keys", "account_locks", "events", "deliveries"] {
        assert_eq!(
            db.count(table).await,
            0,
            "the claim rolls back with its act: nothing of the signal in {table}"
        );
    }

    retry_after_503_is_processed_then_replayed(&db, &server, &tenant, &key, &body).await;
}

async fn transient_failure_after_a_claim_releases_the_lock_and_the_retry_resumes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    // The first commit fails for good, so the claim commits alone (as before a takeover);
    // the act under it then fails transiently.
    let server = Server::start(
        &db,
        &[(
            "FAILPOINTS",
            "act::before_commit=1*return(permanent)->1*return",
        )],
    );
    let key = new_key();
    let body = sim_swap("+447700900008");

    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 503);
    assert_eq!(failed.header("retry-after"), Some("2"));
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM idempotency_keys WHERE state = 'in_flight' \
             AND locked_until = 0 AND ruling IS NOT NULL"
        )
        .await,
        1,
        "the row stays at its recovery point, its decision recorded, its lock released"
    );
    assert_eq!(
        db.count("account_locks").await,
        0,
        "no effect outlives the failed commit"
    );
    assert_eq!(db.count("events").await, 0);

    // No wait for the lock timeout: the lock was released.
    retry_after_503_is_processed_then_replayed(&db, &server, &tenant, &key, &body).await;
}

async fn a_failure_that_persists_is_stored_and_replayed_as_500(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    // Fails the one-commit attempt and the act that runs again under the claim alone.
    let server = Server::start(
        &db,
        &[("FAILPOINTS", "act::before_commit=2*return(permanent)")],
    );
    let key = new_key();
    let body = sim_swap("+447700900013");

    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    assert!(!failed.replayed());
    let replay = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(replay.status, 500);
    assert!(replay.replayed(), "a final failure is stored and replayed");
    assert_eq!(replay.text(), failed.text());
    assert_eq!(db.count("events").await, 0);
    assert_eq!(db.count("account_locks").await, 0);
}

async fn a_failure_that_does_not_persist_is_processed_under_the_claim(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(
        &db,
        &[("FAILPOINTS", "act::before_commit=1*return(permanent)")],
    );
    let key = new_key();
    let body = sim_swap("+447700900014");

    let reply = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["rule"], "recent_sim_swap");
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("account_locks").await, 1);
    let replay = server.send(&tenant, Some(&key), &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.text(), reply.text());
}

/// A server whose first `conflicts` group commits are rolled back as PostgreSQL rolls back a
/// deadlock's victim.
fn server_with_conflicts(db: &TestDb, conflicts: usize) -> Server {
    let failpoints = format!("group_commit::conflict={conflicts}*return");
    Server::start(db, &[("FAILPOINTS", &failpoints)])
}

async fn batch_rolled_back_by_a_deadlock_is_run_again_without_a_503(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    // Two: as many times as the committer runs a batch again.
    let server = server_with_conflicts(&db, 2);
    let key = new_key();
    let body = sim_swap("+447700900016");

    let response = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.json()["rule"], "recent_sim_swap");
    assert!(
        response.json()["actions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["action"] != "callback") // this tenant has no callback URL
            .all(|a| a["outcome"] == "done"),
        "every local action done once, by this request: {}",
        response.text()
    );
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("account_locks").await, 1);
    assert!(
        server
            .logged("group commit rolled back by a conflict; running it again")
            .await
    );
}

async fn batch_rolled_back_by_conflicts_past_the_retries_gets_503_and_resumes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    // One more than the committer runs a batch again for.
    let server = server_with_conflicts(&db, 3);
    let key = new_key();
    let body = sim_swap("+447700900017");

    let failed = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(failed.status, 503, "{}", failed.text());
    assert_eq!(db.count("idempotency_keys").await, 0, "nothing was claimed");
    assert_eq!(db.count("events").await, 0);

    let retried = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(retried.status, 200, "{}", retried.text());
    assert_eq!(db.count("events").await, 1);
}

async fn a_replay_of_the_same_bytes_still_needs_a_valid_signature(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900010");
    assert_eq!(server.send(&tenant, Some(&key), &body).await.status, 200);
    assert!(server.send(&tenant, Some(&key), &body).await.replayed());

    let forger = common::Tenant {
        signing_secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        ..tenant.clone()
    };
    let forged = server.send(&forger, Some(&key), &body).await;
    assert_eq!(
        forged.status, 401,
        "the cache answers only after authentication"
    );
    assert!(!forged.replayed());
}

async fn hundred_concurrent_requests_with_one_key_yield_one_event(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900009");

    let mut tasks = Vec::new();
    for _ in 0..100 {
        let req = common::signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            &tenant,
            Some(&key),
            &body,
            common::now(),
        );
        tasks.push(tokio::spawn(async move {
            common::Reply::from(req.send().await.unwrap()).await
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        replies.push(t.await.unwrap());
    }
    let fresh: Vec<_> = replies
        .iter()
        .filter(|r| r.status == 200 && !r.replayed())
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one request processed the signal");
    for r in &replies {
        match r.status {
            200 => assert_eq!(r.body, fresh[0].body, "every 200 is the same answer"),
            409 => assert_eq!(r.header("retry-after"), Some("2")),
            other => panic!(
                "unexpected status {other}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
    }
    assert_eq!(db.count("events").await, 1);
    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT decision) FROM events")
            .await,
        1
    );
}

async fn reserialised_body_is_a_replay_not_a_422(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900010");

    let first = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(first.status, 200);
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut reordered = String::from("{\n");
    let obj = value.as_object().unwrap();
    let fields: Vec<_> = obj.iter().rev().collect();
    for (i, (k, v)) in fields.iter().enumerate() {
        let sep = if i + 1 < fields.len() { "," } else { "" };
        reordered.push_str(&format!(
            "  {:?} :  {}{sep}\n",
            k,
            serde_json::to_string_pretty(v).unwrap()
        ));
    }
    reordered.push('}');
    assert_ne!(reordered, body);

    let again = server.send(&tenant, Some(&key), &reordered).await;
    assert_eq!(
        again.status,
        200,
        "{}",
        String::from_utf8_lossy(&again.body)
    );
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
}

async fn same_key_under_two_tenants_makes_two_signals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let a = db.tenant(&[]);
    let b = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900011");

    let ra = server.send(&a, Some(&key), &body).await;
    let rb = server.send(&b, Some(&key), &body).await;
    assert_eq!((ra.status, rb.status), (200, 200));
    assert!(!ra.replayed() && !rb.replayed());
    assert_ne!(ra.json()["event_id"], rb.json()["event_id"]);
    assert_ne!(
        ra.json()["subject_hash"],
        rb.json()["subject_hash"],
        "subject digests do not correlate across tenants"
    );
    assert_eq!(db.count("events").await, 2);
}

async fn a_fresh_key_whose_effects_were_already_done_replays_what_it_answered(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900012");
    let first = server.send(&tenant, Some(&new_key()), &body).await;
    assert_eq!(first.status, 200);

    // The same signal under another key: its claim and act commit together, and some of its
    // effects are the first event's, so its key must keep the response it actually got, not
    // the one a fresh signal would have.
    let key = new_key();
    let second = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert!(!second.replayed());
    let outcomes: Vec<_> = second.json()["actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        outcomes.iter().any(|o| o != "done"),
        "an effect was the first event's: {outcomes:?}"
    );
    // Another instance has no cached response: it replays the stored row.
    let other = Server::start(&db, &[]);
    let replay = other.send(&tenant, Some(&key), &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.text(), second.text());
}

async fn expired_key_is_accepted_as_a_new_request(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_KEY_TTL_SECS", "1")]);
    let key = new_key();
    let body = sim_swap("+447700900012");

    let first = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(first.status, 200);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let later = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(later.status, 200);
    assert!(!later.replayed());
    assert_ne!(later.json()["event_id"], first.json()["event_id"]);
    assert_eq!(db.count("events").await, 2);
}

async fn expired_keys_are_pruned_on_schedule(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(
        &db,
        &[
            ("VERDICT_KEY_TTL_SECS", "1"),
            ("VERDICT_PRUNE_INTERVAL_SECS", "1"),
        ],
    );
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900013"))
        .await;
    assert_eq!(reply.status, 200);
    for _ in 0..40 {
        if db.count("idempotency_keys").await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the expired key was not pruned");
}

async fn sigterm_finishes_the_request_in_flight_before_exiting(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(
        &db,
        &[(
            "FAILPOINTS",
            "act::before_commit=1*return(permanent);ingest::after_claim=return(delay_ms=1500)",
        )],
    );
    let req = common::signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        &tenant,
        Some(&new_key()),
        &sim_swap("+447700900014"),
        common::now(),
    );
    let in_flight = tokio::spawn(async move { req.send().await.map(|r| r.status().as_u16()) });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stopped = tokio::task::spawn_blocking(move || server.terminate());
    assert_eq!(
        in_flight.await.unwrap().unwrap(),
        200,
        "the request in flight is finished"
    );
    assert!(stopped.await.unwrap(), "the server exits cleanly");
    assert_eq!(db.count("events").await, 1);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys WHERE state = 'completed'")
            .await,
        1
    );
}

on_both_backends!(
    sigterm_finishes_the_request_in_flight_before_exiting,
    completed_key_replays_status_and_body_with_replayed_header,
    a_completed_key_keeps_no_copy_of_its_answer_and_another_instance_replays_it,
    retry_with_other_body_gets_422,
    in_flight_key_gets_409_with_retry_after_then_the_result,
    abandoned_in_flight_key_is_taken_over_after_the_lock_expires,
    crash_after_the_commit_replays_the_stored_response,
    transient_failure_of_a_fresh_key_stores_nothing_and_the_retry_decides_it,
    transient_failure_after_a_claim_releases_the_lock_and_the_retry_resumes,
    a_failure_that_persists_is_stored_and_replayed_as_500,
    a_failure_that_does_not_persist_is_processed_under_the_claim,
    batch_rolled_back_by_a_deadlock_is_run_again_without_a_503,
    batch_rolled_back_by_conflicts_past_the_retries_gets_503_and_resumes,
    hundred_concurrent_requests_with_one_key_yield_one_event,
    a_replay_of_the_same_bytes_still_needs_a_valid_signature,
    reserialised_body_is_a_replay_not_a_422,
    same_key_under_two_tenants_makes_two_signals,
    a_fresh_key_whose_effects_were_already_done_replays_what_it_answered,
    expired_key_is_accepted_as_a_new_request,
    expired_keys_are_pruned_on_schedule,
);
