//! Exactly-once side effects: the real binary aborted at every failpoint between the phases,
//! restarted, and retried by the client; and duplicates sent with no key at all.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common;
use crate::common::{
    ALL_ACTIONS_PLAYBOOK, Backend, Server, Tenant, TestDb, UNUSED_CALLBACK, action_outcome,
    new_key, post_json, sim_swap,
};

const SIDE_EFFECTS: [&str; 6] = [
    "account_locks",
    "cases",
    "alert_windows",
    "ledger_entries",
    "denies",
    "deliveries",
];

async fn tenant_with_every_action(db: &TestDb) -> Tenant {
    let tenant = db.tenant(&["--callback-url", UNUSED_CALLBACK]);
    db.set_playbook(&tenant, ALL_ACTIONS_PLAYBOOK);
    tenant
}

async fn assert_each_side_effect_once(db: &TestDb) {
    for table in SIDE_EFFECTS {
        assert_eq!(
            db.count(table).await,
            1,
            "{table} should hold exactly one row"
        );
    }
    assert_eq!(
        db.count("case_events").await,
        0,
        "the case holds the event that opened it; none was attached after"
    );
}

/// Aborts the real binary where `failpoints` say (the `fail` crate's syntax), restarts it, and retries with the same key until the
/// dead holder's lock expires: one event, one decision, each side effect once.
async fn crash_at(backend: Backend, failpoints: &str) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let key = new_key();
    let body = sim_swap("+447700900201");
    let lock = ("VERDICT_LOCK_TIMEOUT_SECS", "1");

    let doomed = Server::start(&db, &[lock, ("FAILPOINTS", failpoints)]);
    doomed.send_raw_expecting_crash(&tenant, &key, &body).await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted at {failpoints}"
    );

    let server = Server::start(&db, &[lock]);
    let mut reply = server.send(&tenant, Some(&key), &body).await;
    for _ in 0..30 {
        if reply.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        reply = server.send(&tenant, Some(&key), &body).await;
    }
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let decided = reply.json();
    assert_eq!(decided["decision"], "deny");
    for action in decided["actions"].as_array().unwrap() {
        assert_eq!(
            action["outcome"], "done",
            "the retry reports the same event's effects as done: {action}"
        );
    }
    assert_eq!(db.count("events").await, 1);
    assert_each_side_effect_once(&db).await;

    let replay = server.send(&tenant, Some(&key), &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.json(), decided);
}

async fn crash_after_claim_is_exactly_once(b: Backend) {
    crash_at(
        b,
        "act::before_commit=1*return(permanent);ingest::after_claim=return(abort)",
    )
    .await
}
async fn crash_after_lock_account_is_exactly_once(b: Backend) {
    crash_at(b, "act::after_lock_account=return(abort)").await
}
async fn crash_after_open_case_is_exactly_once(b: Backend) {
    crash_at(b, "act::after_open_case=return(abort)").await
}
async fn crash_after_alert_customer_is_exactly_once(b: Backend) {
    crash_at(b, "act::after_alert_customer=return(abort)").await
}
async fn crash_after_charge_step_up_is_exactly_once(b: Backend) {
    crash_at(b, "act::after_charge_step_up=return(abort)").await
}
async fn crash_after_deny_is_exactly_once(b: Backend) {
    crash_at(b, "act::after_deny=return(abort)").await
}
async fn crash_after_dispatch_is_exactly_once(b: Backend) {
    crash_at(b, "ingest::after_dispatch=return(abort)").await
}
async fn crash_inside_the_commit_is_exactly_once(b: Backend) {
    crash_at(b, "act::before_commit=return(abort)").await
}

async fn same_signal_five_times_without_a_key_has_each_effect_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900202");
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let reply = server.send(&tenant, None, &body).await;
        assert_eq!(reply.status, 200);
        outcomes.push(reply.json()["actions"].clone());
    }
    assert_eq!(
        db.count("events").await,
        5,
        "without a key, each delivery is processed"
    );
    for table in [
        "account_locks",
        "cases",
        "alert_windows",
        "ledger_entries",
        "denies",
        "deliveries",
    ] {
        assert_eq!(
            db.count(table).await,
            1,
            "{table} should hold exactly one row"
        );
    }
    assert_eq!(
        db.count("case_events").await,
        4,
        "each event after the opener is attached to the one open case"
    );
    for later in &outcomes[1..] {
        for action in later.as_array().unwrap() {
            assert_eq!(action["outcome"], "already_done", "{action}");
        }
    }
    // The five events say they are one signal.
    let events = server.get(&tenant, "/v1/events").await.json();
    let keys: std::collections::HashSet<String> = events["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["signal_key"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys.len(), 1, "{events}");
    let other = server.send(&tenant, None, &sim_swap("+447700900203")).await;
    let other = server
        .event(&tenant, other.json()["event_id"].as_str().unwrap())
        .await;
    assert!(
        !keys.contains(other["signal_key"].as_str().unwrap()),
        "{other}"
    );
}

/// A step-up charge stored before its uniqueness led with the signal's time, whose event was
/// pruned by then, has no time (`postgres/0031`, `sqlite/0029` move it to
/// `ledger_entries_untimed`): the same signal sent again is still not charged twice.
async fn a_charge_stored_without_its_signals_time_is_not_made_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900204");
    assert_eq!(server.send(&tenant, None, &body).await.status, 200);
    // As the migration leaves an entry whose event was gone (the event itself stays here: the
    // untimed entry alone must stop the charge).
    db.exec(
        "INSERT INTO ledger_entries_untimed (tenant_id, signal_key, event_id, id, subject_hash, \
         kind, created_at) SELECT tenant_id, signal_key, event_id, id, subject_hash, kind, \
         created_at FROM ledger_entries",
    )
    .await;
    assert_eq!(db.exec("DELETE FROM ledger_entries").await, 1);

    let again = server.send(&tenant, None, &body).await;
    assert_eq!(again.status, 200);
    let charge = again.json()["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "charge_step_up")
        .cloned()
        .unwrap();
    assert_eq!(charge["outcome"], "already_done", "{charge}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger_entries").await,
        0,
        "one charge per signal"
    );
}

/// Step-up charges stored before their uniqueness led with the signal's time take their
/// event's observation time when migrated; one whose event was pruned keeps none and moves
/// aside, its signal key still unique there. An insert without the time, as an older process
/// would make, is refused rather than charging a signal again.
async fn charges_stored_before_the_time_ordered_index_take_their_signals_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant_id = uuid::Uuid::now_v7();
    let event_id = uuid::Uuid::now_v7();
    let (timed_key, untimed_key) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let (blob, bytes) = (|id| db.uuid_sql(id), |id| db.bytes_sql(id));
    let (tenant, event) = (blob(tenant_id), blob(event_id));
    // As an older version inserted them: no observation time.
    let entry = |key: uuid::Uuid, event: &str| {
        format!(
            "INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, \
             kind, created_at) VALUES ({}, {tenant}, {event}, {}, {}, 'step_up_verification', \
             1700000000300)",
            blob(uuid::Uuid::now_v7()),
            bytes(key),
            bytes(key),
        )
    };
    let statements = [
        format!(
            "INSERT INTO tenants (id, name, inbound_signature_required, created_at) \
             VALUES ({tenant}, 'old', FALSE, 1)"
        ),
        format!(
            "INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, \
             attributes, metadata, decision, playbook_version, rule, actions, created_at, \
             signal_key) VALUES ({event}, {tenant}, 'credential_breach', {s}, 1700000000123, \
             '{{}}', '{{}}', 'step_up', 1, 'r', 'charge_step_up', 1700000000200, {s})",
            s = bytes(timed_key),
        ),
        entry(timed_key, &event),
        // Its event pruned: no row of it is left.
        entry(untimed_key, &blob(uuid::Uuid::now_v7())),
    ];
    crate::endpoint_delivery::migrated_before(&db, ("0029", "0031"), &statements).await;
    // The current binary migrates.
    db.cli(&["tenant", "list", "--json"]);
    assert_eq!(
        db.scalar("SELECT observed_at FROM ledger_entries").await,
        1_700_000_000_123,
        "the entry whose event is there takes its time, and is the only one left"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM ledger_entries_untimed")
            .await,
        1,
        "the entry whose event was pruned moves aside"
    );
    let unique = |refused: Result<u64, sqlx::Error>| matches!(refused, Err(sqlx::Error::Database(e)) if e.is_unique_violation());
    let timed_again = db
        .try_exec(format!(
            "INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, \
             kind, created_at, observed_at) VALUES ({}, {tenant}, {}, {k}, {k}, \
             'step_up_verification', 1, 1700000000123)",
            blob(uuid::Uuid::now_v7()),
            blob(uuid::Uuid::now_v7()),
            k = bytes(timed_key),
        ))
        .await;
    assert!(unique(timed_again), "one entry per signal and time");
    // The event's own unique is gone (one per signal makes it one per event).
    let same_event = db
        .try_exec(format!(
            "INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, \
             kind, created_at, observed_at) VALUES ({}, {tenant}, {event}, {k}, {k}, \
             'step_up_verification', 1, 1700000000999)",
            blob(uuid::Uuid::now_v7()),
            k = bytes(uuid::Uuid::new_v4()),
        ))
        .await;
    assert!(same_event.is_ok(), "{same_event:?}");
    let untimed_again = db
        .try_exec(format!(
            "INSERT INTO ledger_entries_untimed (tenant_id, signal_key, event_id, id, \
             subject_hash, kind, created_at) VALUES ({tenant}, {k}, {event}, {}, {k}, \
             'step_up_verification', 1)",
            blob(uuid::Uuid::now_v7()),
            k = bytes(untimed_key),
        ))
        .await;
    assert!(unique(untimed_again), "one untimed entry per signal");
    let without_time = db.try_exec(entry(uuid::Uuid::new_v4(), &event)).await;
    assert!(
        matches!(&without_time, Err(sqlx::Error::Database(e))
            if e.kind() == sqlx::error::ErrorKind::NotNullViolation),
        "an entry without its signal's time is refused: {without_time:?}"
    );
}

async fn a_crash_after_dispatch_without_a_key_leaves_no_callback_without_its_event(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let body = sim_swap("+447700900205");
    let doomed = Server::start(
        &db,
        &[("FAILPOINTS", "ingest::after_dispatch=return(abort)")],
    );
    let req = common::signed(
        doomed.client.post(format!("{}/v1/signals", doomed.base)),
        &tenant,
        None,
        &body,
        common::now(),
    );
    assert!(
        req.send().await.is_err(),
        "the connection dies with the process"
    );
    assert!(doomed.wait_for_crash());
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(
        db.count("events").await,
        1,
        "without a key, the event is stored with the callback's outbox row"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries d JOIN events e ON e.id = d.event_id")
            .await,
        1
    );

    // The client's retry is another event; every effect stays single.
    let server = Server::start(&db, &[]);
    assert_eq!(server.send(&tenant, None, &body).await.status, 200);
    for table in [
        "account_locks",
        "cases",
        "alert_windows",
        "ledger_entries",
        "denies",
        "deliveries",
    ] {
        assert_eq!(db.count(table).await, 1, "{table}");
    }
}

/// Sends every (key, body) at once and returns the replies, each of which must be a 200.
async fn send_at_once(
    server: &Server,
    tenant: &Tenant,
    signals: Vec<(Option<String>, String)>,
) -> Vec<Value> {
    let mut tasks = Vec::new();
    for (key, body) in signals {
        let req = common::signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            tenant,
            key.as_deref(),
            &body,
            common::now(),
        );
        tasks.push(tokio::spawn(async move {
            let response = req.send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }));
    }
    let mut replies = Vec::new();
    for t in tasks {
        let (status, reply) = t.await.unwrap();
        assert_eq!(status, 200, "{reply}");
        replies.push(reply);
    }
    replies
}

async fn concurrent_duplicates_without_a_key_still_have_each_effect_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900203");
    let replies = send_at_once(&server, &tenant, vec![(None, body); 10]).await;
    for table in [
        "account_locks",
        "cases",
        "alert_windows",
        "ledger_entries",
        "denies",
        "deliveries",
    ] {
        assert_eq!(db.count(table).await, 1, "{table}");
    }
    // One of them did the work and says so; every other one reports it already done, and
    // each event stores what its response said.
    let all = |reply: &Value, outcome: &str| {
        reply["actions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["outcome"] == outcome)
    };
    let doers = replies.iter().filter(|r| all(r, "done")).count();
    assert_eq!(doers, 1, "{replies:#?}");
    for reply in replies.iter().filter(|r| !all(r, "done")) {
        assert!(all(reply, "already_done"), "{reply}");
    }
    for reply in &replies {
        let event_id = reply["event_id"].as_str().unwrap();
        let event = server.event(&tenant, event_id).await;
        assert_eq!(event["actions"], reply["actions"], "{event_id}");
    }
}

async fn an_open_case_collects_later_events_for_the_subject(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900204"))
        .await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900204"))
        .await;
    assert_eq!(first.json()["subject_hash"], second.json()["subject_hash"]);
    let outcome = |r: &common::Reply, action: &str| {
        r.json()["actions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["action"] == action)
            .unwrap()["outcome"]
            .clone()
    };
    assert_eq!(outcome(&second, "open_case"), "already_done");
    assert_eq!(outcome(&second, "lock_account"), "already_done");
    assert_eq!(
        outcome(&second, "alert_customer"),
        "already_done",
        "the first signal's alert holds the window"
    );
    assert_eq!(
        outcome(&second, "charge_step_up"),
        "done",
        "a different signal is charged"
    );
    assert_eq!(db.count("cases").await, 1);
    assert_eq!(
        db.count("case_events").await,
        1,
        "the second signal's event"
    );

    let hash = first.json()["subject_hash"].as_str().unwrap().to_owned();
    let subject = server.get(&tenant, &format!("/v1/subjects/{hash}")).await;
    assert_eq!(subject.status, 200);
    let s = subject.json();
    assert_eq!(s["lock"]["event_id"], first.json()["event_id"]);
    assert_eq!(s["deny"]["event_id"], first.json()["event_id"]);
    assert_eq!(s["open_cases"].as_array().unwrap().len(), 1);
    assert_eq!(s["open_cases"][0]["events"].as_array().unwrap().len(), 2);
    assert_eq!(
        s["open_cases"][0]["events"][0],
        first.json()["event_id"],
        "the opener first, then the event attached after it"
    );
    assert_eq!(s["open_cases"][0]["events"][1], second.json()["event_id"]);
}

/// Distinct signals about one subject at once, most of them in one group commit: the first
/// event holds the lock, the deny and the case, each other one is attached to that case, and
/// every response says which of these its event did.
async fn concurrent_signals_about_one_subject_take_each_hold_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let signals = (1..=12)
        .map(|minutes_ago| {
            let body = common::sim_swap_of_account("acct-concurrent-1", minutes_ago);
            (Some(new_key()), body)
        })
        .collect();
    let replies = send_at_once(&server, &tenant, signals).await;
    let outcome = |reply: &Value, action: &str| {
        reply["actions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["action"] == action)
            .unwrap()["outcome"]
            .clone()
    };
    let holders: Vec<_> = replies
        .iter()
        .filter(|r| outcome(r, "lock_account") == "done")
        .collect();
    assert_eq!(holders.len(), 1, "{replies:#?}");
    let holder = holders[0];
    for action in ["open_case", "deny"] {
        assert_eq!(outcome(holder, action), "done", "{holder}");
    }
    for reply in replies
        .iter()
        .filter(|r| r["event_id"] != holder["event_id"])
    {
        for action in ["lock_account", "open_case", "deny"] {
            assert_eq!(outcome(reply, action), "already_done", "{action}: {reply}");
        }
    }
    let alerted = replies
        .iter()
        .filter(|r| outcome(r, "alert_customer") == "done")
        .count();
    assert_eq!(alerted, 1, "one alert a window: {replies:#?}");
    assert_eq!(db.count("account_locks").await, 1);
    assert_eq!(db.count("denies").await, 1);
    assert_eq!(db.count("alert_windows").await, 1);
    assert_eq!(db.count("cases").await, 1);
    assert_eq!(
        db.count("case_events").await,
        11,
        "every event but the opener"
    );

    let hash = holder["subject_hash"].as_str().unwrap().to_owned();
    let s = server
        .get(&tenant, &format!("/v1/subjects/{hash}"))
        .await
        .json();
    assert_eq!(s["lock"]["event_id"], holder["event_id"]);
    assert_eq!(s["deny"]["event_id"], holder["event_id"]);
    assert_eq!(s["open_cases"].as_array().unwrap().len(), 1);
    let events = s["open_cases"][0]["events"].as_array().unwrap();
    assert_eq!(events.len(), 12);
    assert!(events.contains(&holder["event_id"]), "{s}");
}

/// A subject's lock, deny and open case are one row: undone one at a time, the others stand;
/// undone all, the row goes; the next signal takes each again, with a new case.
async fn a_subjects_lock_deny_and_case_are_undone_apart_and_taken_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = tenant_with_every_action(&db).await;
    let server = Server::start(&db, &[]);
    let phone = "+447700900311";
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap(phone))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    let hash = first["subject_hash"].as_str().unwrap().to_owned();
    let (server, tenant, hash) = (&server, &tenant, &hash);
    let state = || async move {
        let reply = server.get(tenant, &format!("/v1/subjects/{hash}")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()
    };
    let undo = |way: &'static str| async move {
        let body = json!({"subject": {"phone": phone}, "reason": "a test"});
        let reply = post_json(server, tenant, &format!("/v1/subjects/{way}"), body).await;
        assert_eq!(reply.status, 200, "{way}: {}", reply.text());
        assert_eq!(reply.json()["outcome"], "done", "{way}");
    };
    let s = state().await;
    assert_eq!(s["lock"]["event_id"], first["event_id"], "{s}");
    assert_eq!(s["deny"]["event_id"], first["event_id"], "{s}");
    let case = s["open_cases"][0]["id"].clone();
    assert!(case.is_string(), "{s}");

    undo("unlock").await;
    let s = state().await;
    assert!(s["lock"].is_null(), "{s}");
    assert_eq!(
        s["deny"]["event_id"], first["event_id"],
        "the deny stands: {s}"
    );
    assert_eq!(s["open_cases"][0]["id"], case, "the case stays open: {s}");
    undo("lift-deny").await;
    let s = state().await;
    assert!(s["lock"].is_null() && s["deny"].is_null(), "{s}");
    assert_eq!(s["open_cases"][0]["id"], case, "the case stays open: {s}");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM subjects").await, 1);
    undo("close-case").await;
    let s = state().await;
    assert_eq!(s["open_cases"], json!([]), "{s}");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM subjects").await,
        0,
        "nothing stands on the subject: its row goes"
    );
    assert_eq!(db.count("cases").await, 1, "the closed case is kept");

    // The signal key has the observation time to the second: the next swap is another signal.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let next = server
        .send(tenant, Some(&new_key()), &sim_swap(phone))
        .await;
    assert_eq!(next.status, 200, "{}", next.text());
    let next = next.json();
    for action in ["lock_account", "deny", "open_case"] {
        assert_eq!(
            action_outcome(&next, action)["outcome"],
            "done",
            "{action}: {next}"
        );
    }
    let s = state().await;
    assert_eq!(s["lock"]["event_id"], next["event_id"], "{s}");
    assert_eq!(s["deny"]["event_id"], next["event_id"], "{s}");
    assert_ne!(s["open_cases"][0]["id"], case, "a new case: {s}");
    assert_eq!(db.count("cases").await, 2);
}

/// Locks, denies and open cases stored as two tables and a partial index did, before a
/// subject's state was one row, still stand, each with its event; a closed case opens none.
async fn locks_denies_and_open_cases_stored_before_the_subjects_row_still_stand(backend: Backend) {
    let db = TestDb::new(backend).await;
    let (blob, bytes) = (|id| db.uuid_sql(id), |id| db.bytes_sql(id));
    let tenant = blob(uuid::Uuid::now_v7());
    let [both, locked, denied, opened, closed] = [(); 5].map(|()| uuid::Uuid::new_v4());
    let [lock_event, deny_event, case_id, only_case_id, closed_id] =
        [(); 5].map(|()| uuid::Uuid::now_v7());
    let lock = |subject| {
        format!(
            "INSERT INTO account_locks (tenant_id, subject_hash, event_id, locked_at) \
             VALUES ({tenant}, {}, {}, 10)",
            bytes(subject),
            blob(lock_event)
        )
    };
    let deny = |subject| {
        format!(
            "INSERT INTO denies (tenant_id, subject_hash, event_id, issued_at) \
             VALUES ({tenant}, {}, {}, 20)",
            bytes(subject),
            blob(deny_event)
        )
    };
    let case = |id, subject, status| {
        format!(
            "INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, \
             opened_at) VALUES ({}, {tenant}, {}, '{status}', {}, 30)",
            blob(id),
            bytes(subject),
            blob(lock_event)
        )
    };
    let statements = [
        format!(
            "INSERT INTO tenants (id, name, inbound_signature_required, created_at) \
             VALUES ({tenant}, 'old', FALSE, 1)"
        ),
        lock(both),
        deny(both),
        case(case_id, both, "open"),
        lock(locked),
        deny(denied),
        case(only_case_id, opened, "open"),
        case(closed_id, closed, "closed"),
    ];
    crate::endpoint_delivery::migrated_before(&db, ("0030", "0032"), &statements).await;
    // The current binary migrates.
    db.cli(&["tenant", "list", "--json"]);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM subjects").await, 4);
    assert_eq!(db.count("account_locks").await, 2);
    assert_eq!(db.count("denies").await, 2);
    // Each subject's row as expected: an update that matches it exactly touches one row.
    let matches = |subject, condition: String| {
        format!(
            "UPDATE subjects SET locked_at = locked_at WHERE tenant_id = {tenant} \
             AND subject_hash = {} AND {condition}",
            bytes(subject)
        )
    };
    let (lock_event, deny_event) = (blob(lock_event), blob(deny_event));
    for (subject, condition) in [
        (
            both,
            format!(
                "locked_by = {lock_event} AND locked_at = 10 AND denied_by = {deny_event} \
                 AND denied_at = 20 AND open_case = {}",
                blob(case_id)
            ),
        ),
        (
            locked,
            format!(
                "locked_by = {lock_event} AND locked_at = 10 AND denied_by IS NULL \
                 AND open_case IS NULL"
            ),
        ),
        (
            denied,
            format!(
                "locked_by IS NULL AND denied_by = {deny_event} AND denied_at = 20 \
                 AND open_case IS NULL"
            ),
        ),
        (
            opened,
            format!(
                "locked_by IS NULL AND denied_by IS NULL AND open_case = {}",
                blob(only_case_id)
            ),
        ),
    ] {
        assert_eq!(
            db.exec(matches(subject, condition.clone())).await,
            1,
            "{condition}"
        );
    }
    assert_eq!(
        db.exec(matches(closed, "TRUE".to_owned())).await,
        0,
        "a closed case leaves nothing standing"
    );
}

on_both_backends!(
    crash_after_claim_is_exactly_once,
    crash_after_lock_account_is_exactly_once,
    crash_after_open_case_is_exactly_once,
    crash_after_alert_customer_is_exactly_once,
    crash_after_charge_step_up_is_exactly_once,
    crash_after_deny_is_exactly_once,
    crash_after_dispatch_is_exactly_once,
    crash_inside_the_commit_is_exactly_once,
    same_signal_five_times_without_a_key_has_each_effect_once,
    concurrent_duplicates_without_a_key_still_have_each_effect_once,
    a_crash_after_dispatch_without_a_key_leaves_no_callback_without_its_event,
    an_open_case_collects_later_events_for_the_subject,
    concurrent_signals_about_one_subject_take_each_hold_once,
    a_charge_stored_without_its_signals_time_is_not_made_again,
    charges_stored_before_the_time_ordered_index_take_their_signals_time,
    a_subjects_lock_deny_and_case_are_undone_apart_and_taken_again,
    locks_denies_and_open_cases_stored_before_the_subjects_row_still_stand,
);
