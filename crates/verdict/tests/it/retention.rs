//! Retention on both backends: events past the window go with their deliveries and attempts,
//! never one whose delivery is pending, never the state they produced; old
//! playbook versions go unless an event names them. Rows are back-dated; `verdict prune` and the
//! server's pruner do the deleting.

use std::time::Duration;

use verdict::retention::{Pruner, RESWEEP_EVERY, RetentionSettings, Sweep};

use crate::common::receiver::{Receiver, Step};
use crate::common::{
    ALL_ACTIONS_PLAYBOOK, Backend, MANUAL_WORKER, Server, Tenant, TestDb, new_key, sim_swap,
};
use serde_json::Value;

const DAY_MS: i64 = 86_400_000;

/// A server whose pruner stays out of the way (its first run is at start).
fn quiet_pruner() -> Vec<(&'static str, &'static str)> {
    let mut env = MANUAL_WORKER.to_vec();
    env.push(("VERDICT_PRUNE_INTERVAL_SECS", "3600"));
    env
}

fn prune(db: &TestDb) -> Value {
    serde_json::from_str(&db.cli(&["prune"])).unwrap()
}

async fn wait_for_attempts(db: &TestDb, n: i64) {
    for _ in 0..100 {
        if db.count("delivery_attempts").await >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {n} attempts were recorded");
}

/// Sends a fresh SIM swap per phone through a server of its own, and waits until each
/// callback was attempted.
async fn signals_sent(db: &TestDb, tenant: &Tenant, phones: &[&str]) {
    let server = Server::start(db, &quiet_pruner());
    for phone in phones {
        let reply = server
            .send(tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    wait_for_attempts(db, i64::try_from(phones.len()).unwrap()).await;
}

async fn events_past_retention_go_with_their_deliveries_but_never_a_pending_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![
        Step::status(200),
        Step::status(500),
        Step::status(400),
    ])
    .await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    db.set_playbook(&tenant, ALL_ACTIONS_PLAYBOOK);
    let server = Server::start(&db, &quiet_pruner());

    // Succeeded, pending (a 500 to retry), failed: then 91 days pass.
    let mut old = Vec::new();
    for phone in ["+447700900901", "+447700900902", "+447700900903"] {
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(reply.status, 200);
        old.push(reply.json()["event_id"].as_str().unwrap().to_owned());
    }
    wait_for_attempts(&db, 3).await;
    db.exec(format!(
        "UPDATE events SET created_at = created_at - {}",
        91 * DAY_MS
    ))
    .await;
    let recent = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900904"))
        .await;
    wait_for_attempts(&db, 4).await;

    let pruned = prune(&db);
    assert_eq!(pruned["events"], 2, "{pruned}");
    assert_eq!(pruned["deliveries"], 2, "{pruned}");
    assert_eq!(pruned["delivery_attempts"], 2, "{pruned}");
    assert!(pruned.get("alerts").is_none(), "{pruned}");
    assert_eq!(db.count("events").await, 2);
    assert_eq!(db.count("deliveries").await, 2);
    assert_eq!(db.count("delivery_attempts").await, 2);
    // What the events did stays: locks, denies, cases, alert windows and charges outlive them.
    for table in [
        "account_locks",
        "denies",
        "cases",
        "alert_windows",
        "ledger_entries",
    ] {
        assert_eq!(db.count(table).await, 4, "{table}");
    }

    // The pending one is whole, the settled ones are gone.
    let pending = server.event(&tenant, &old[1]).await;
    assert_eq!(pending["deliveries"][0]["status"], "pending");
    for gone in [&old[0], &old[2]] {
        assert_eq!(
            server
                .get(&tenant, &format!("/v1/events/{gone}"))
                .await
                .status,
            404
        );
    }
    let recent_id = recent.json()["event_id"].as_str().unwrap().to_owned();
    assert_eq!(
        server
            .get(&tenant, &format!("/v1/events/{recent_id}"))
            .await
            .status,
        200
    );

    // Once its delivery settles, it goes too; then there is nothing left to do.
    db.exec("UPDATE deliveries SET status = 'dead' WHERE status = 'pending'")
        .await;
    assert_eq!(prune(&db)["events"], 1);
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("deliveries").await, 1);
    let again = prune(&db);
    assert_eq!(
        (
            again["events"].as_i64(),
            again["playbook_versions"].as_i64()
        ),
        (Some(0), Some(0)),
        "{again}"
    );
}

async fn the_servers_pruner_applies_the_configured_retention(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let mut env = MANUAL_WORKER.to_vec();
    env.extend([
        ("VERDICT_EVENT_RETENTION_DAYS", "1"),
        ("VERDICT_PRUNE_INTERVAL_SECS", "1"),
    ]);
    let server = Server::start(&db, &env);
    for phone in ["+447700900911", "+447700900912"] {
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(reply.status, 200);
    }
    wait_for_attempts(&db, 2).await;
    // One of them two days old: past a one-day retention.
    db.exec(format!(
        "UPDATE events SET created_at = created_at - {} WHERE created_at = \
         (SELECT MIN(created_at) FROM events)",
        2 * DAY_MS
    ))
    .await;
    for _ in 0..100 {
        if db.count("events").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.count("events").await, 1);
    assert_eq!(db.count("deliveries").await, 1);
    assert_eq!(db.count("delivery_attempts").await, 1);
    assert!(server.logged("pruned past retention").await);
}

async fn a_suspended_callback_keeps_its_event_past_retention_but_not_past_twice_it(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(410)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &quiet_pruner());
    // A 410 disables the endpoint; the next signal's callback is kept suspended.
    for phone in ["+447700900921", "+447700900922"] {
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(reply.status, 200);
        wait_for_attempts(&db, 1).await;
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'suspended'")
            .await,
        1
    );

    // 91 days: past the 90-day window, so the failed one goes; the suspended one waits.
    let back_date = |days: i64| {
        format!(
            "UPDATE events SET created_at = created_at - {}",
            days * DAY_MS
        )
    };
    db.exec(back_date(91)).await;
    let pruned = prune(&db);
    assert_eq!(
        (pruned["events"].as_i64(), pruned["deliveries"].as_i64()),
        (Some(1), Some(1)),
        "{pruned}"
    );
    assert_eq!(db.count("events").await, 1);
    // 179 days: still within twice the window.
    db.exec(back_date(88)).await;
    assert_eq!(prune(&db)["events"], 0);
    assert_eq!(db.count("deliveries").await, 1);
    // 181 days: past twice the window, it goes with its event.
    db.exec(back_date(2)).await;
    let pruned = prune(&db);
    assert_eq!(
        (pruned["events"].as_i64(), pruned["deliveries"].as_i64()),
        (Some(1), Some(1)),
        "{pruned}"
    );
    assert_eq!(db.count("events").await, 0);
    assert_eq!(db.count("deliveries").await, 0);
}

async fn playbook_versions_beyond_the_newest_50_go_unless_an_event_names_them(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    for _ in 0..3 {
        db.set_playbook(&tenant, ALL_ACTIONS_PLAYBOOK);
    }
    let server = Server::start(&db, &quiet_pruner());
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900921"))
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        db.scalar("SELECT MAX(playbook_version) FROM events").await,
        3
    );
    // Versions 4 to 60, uploaded since.
    db.exec(format!(
        "INSERT INTO playbooks (tenant_id, version, format, source, created_at) \
         WITH RECURSIVE n(v) AS (SELECT 4 UNION ALL SELECT v + 1 FROM n WHERE v < 60) \
         SELECT t.id, n.v, 'toml', '{}', 0 FROM tenants t, n",
        ALL_ACTIONS_PLAYBOOK.replace('\'', "''")
    ))
    .await;

    // 1 to 10 are beyond the newest 50; 3 is named by the event.
    assert_eq!(prune(&db)["playbook_versions"], 9);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM playbooks").await, 51);
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM playbooks WHERE version = 3")
            .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT MIN(version) FROM playbooks WHERE version <> 3")
            .await,
        11
    );
    assert!(
        db.cli(&["playbook", "show", "--tenant", &tenant.id])
            .starts_with("# version 60")
    );
    assert_eq!(prune(&db)["playbook_versions"], 0);

    // Once the event is past retention and gone, its version goes too.
    db.exec(format!(
        "UPDATE events SET created_at = created_at - {}",
        91 * DAY_MS
    ))
    .await;
    db.exec("UPDATE deliveries SET status = 'failed'").await;
    let pruned = prune(&db);
    assert_eq!(
        (
            pruned["events"].as_i64(),
            pruned["playbook_versions"].as_i64()
        ),
        (Some(1), Some(1)),
        "{pruned}"
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM playbooks").await, 50);
}

async fn a_backlog_past_one_runs_bound_is_pruned_without_waiting_for_the_next_tick(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    {
        let server = Server::start(&db, &quiet_pruner());
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap("+447700900931"))
            .await;
        assert_eq!(reply.status, 200);
    }
    // 12,000 expired copies of its key: more than one run's 20 batches of 500. Seven share
    // each expiry, so some batches end inside a run of equal expiries, where the next starts.
    let digest = match backend {
        Backend::Postgres => "int8send(n.i)",
        Backend::Sqlite => "CAST(n.i AS BLOB)",
    };
    let seeded = db
        .exec(format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 12000) \
             INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, fingerprint, state, \
                event_id, lock_token, locked_until, action_results, response_status, \
                response_body, created_at, expires_at, ruling) \
             SELECT k.tenant_id, k.endpoint, {digest}, k.fingerprint, k.state, k.event_id, \
                k.lock_token, k.locked_until, k.action_results, k.response_status, \
                k.response_body, k.created_at, n.i / 7, k.ruling FROM idempotency_keys k, n"
        ))
        .await;
    assert_eq!(seeded, 12_000);

    // The first run is at start; the next tick is an hour away.
    let server = Server::start(&db, &quiet_pruner());
    for _ in 0..200 {
        if db.count("idempotency_keys").await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(db.count("idempotency_keys").await, 1, "the live key stays");
    assert!(server.logged("pruned past retention").await);
}

async fn an_event_passed_over_while_its_delivery_was_pending_goes_in_the_next_sweep(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(500), Step::status(200)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    signals_sent(&db, &tenant, &["+447700900941", "+447700900942"]).await;
    // The pending one (a 500 to retry) is the older of the two past retention.
    db.exec(format!(
        "UPDATE events SET created_at = created_at - CASE WHEN EXISTS (SELECT 1 FROM \
         deliveries d WHERE d.event_id = events.id AND d.status = 'pending') \
         THEN {} ELSE {} END",
        92 * DAY_MS,
        91 * DAY_MS
    ))
    .await;
    let store = verdict::store::connect(&db.url).await.unwrap();
    let settings = RetentionSettings {
        events: Duration::from_secs(90 * 86_400),
    };
    // One server run of the pruner: the events it deleted, and where its sweep got to.
    let run = |sweep: Sweep| {
        let store = store.clone();
        async move {
            let now = verdict::clock::now_ms();
            let mut pruner = Pruner::new(sweep);
            let (pruned, _) = pruner
                .run(&*store, settings, now, usize::MAX)
                .await
                .unwrap();
            (pruned.events, pruner.sweep())
        }
    };

    let (events, sweep) = run(Sweep::new(verdict::clock::now_ms())).await;
    assert_eq!(events, 1, "the settled one goes, the pending one stays");
    let kept_at = db.scalar("SELECT created_at FROM events").await;
    assert_eq!(
        sweep.position().events_left,
        Some(kept_at),
        "the sweep notes where it left the pending one"
    );
    assert!(sweep.position().events_from > kept_at);

    // Settled now, but older than where the sweep got to: it waits for the next sweep (a
    // delay the sweep accepts, so that no batch reads the rows deleted before it again),
    // which goes back to where it was left, not to the oldest rows.
    db.exec("UPDATE deliveries SET status = 'dead' WHERE status = 'pending'")
        .await;
    let (events, sweep) = run(sweep).await;
    assert_eq!(events, 0);
    let every = i64::try_from(RESWEEP_EVERY.as_millis()).unwrap();
    let resweep = sweep.renewed(sweep.position().started_at + every);
    assert_eq!(resweep.position().events_from, kept_at);
    let (events, _) = run(resweep).await;
    assert_eq!(events, 1);
    assert_eq!(db.count("events").await, 0);
}

async fn a_restarted_pruner_resumes_the_sweep_where_the_last_one_left_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(204)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    signals_sent(&db, &tenant, &["+447700900943", "+447700900944"]).await;
    db.exec(format!(
        "UPDATE events SET created_at = created_at - {}",
        91 * DAY_MS
    ))
    .await;
    let newest = db.scalar("SELECT MAX(created_at) FROM events").await;

    // This server's pruner runs at its start, and saves where its sweep got to.
    let server = Server::start(&db, &quiet_pruner());
    let mut saved = None;
    for _ in 0..200 {
        if db.scalar("SELECT COUNT(*) FROM retention_sweep").await == 1 {
            saved = Some(db.scalar("SELECT events_from FROM retention_sweep").await);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(saved, Some(newest), "the sweep is saved where it got to");
    assert_eq!(db.count("events").await, 0);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900945"))
        .await;
    assert_eq!(reply.status, 200);
    // The first two went with their deliveries.
    wait_for_attempts(&db, 1).await;
    server.kill();

    // An event past retention but behind where the sweep got to (as a pending one is once
    // settled): the next server resumes the saved sweep, past it, and leaves it for the next
    // resweep rather than walking every row pruned before.
    db.exec(format!("UPDATE events SET created_at = {}", newest - 1))
        .await;
    let server = Server::start(&db, &quiet_pruner());
    assert!(server.logged("pruner resumes the saved sweep").await);
    // Its run at start, from there: nothing to delete.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            db.count("events").await,
            1,
            "the server's resumed sweep is past it"
        );
    }
    let store = verdict::store::connect(&db.url).await.unwrap();
    let now = verdict::clock::now_ms();
    let settings = RetentionSettings {
        events: Duration::from_secs(90 * 86_400),
    };
    let (pruned, _) = Pruner::resumed(&*store, now)
        .await
        .run(&*store, settings, now, usize::MAX)
        .await
        .unwrap();
    assert_eq!(pruned.events, 0, "the saved sweep is past it");
    let (pruned, _) = Pruner::new(Sweep::new(now))
        .run(&*store, settings, now, usize::MAX)
        .await
        .unwrap();
    assert_eq!(pruned.events, 1, "a sweep from the oldest rows finds it");
}

/// On PostgreSQL a redelivery can land between an event batch's pick and its deletes (on
/// SQLite the batch holds the one writer throughout): the event stays, and the sweep notes
/// where it was left, so its next pass comes back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_event_redelivered_between_the_pick_and_the_delete_stays_and_is_noted() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(vec![Step::status(204)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    signals_sent(&db, &tenant, &["+447700900946", "+447700900947"]).await;
    // Both past retention, a second apart: the redelivered one is not where the batch ends.
    db.exec(format!(
        "UPDATE events SET created_at = CASE WHEN id = \
         (SELECT id FROM events ORDER BY id LIMIT 1) THEN {past} ELSE {past} + 1000 END",
        past = verdict::clock::now_ms() - 91 * DAY_MS
    ))
    .await;
    let older = db.scalar("SELECT MIN(created_at) FROM events").await;

    // The server's pruner runs at its start, and holds its event batch after the pick.
    let mut env = quiet_pruner();
    env.push(("FAILPOINTS", "prune::after_pick=1*return(delay_ms=3000)"));
    let _server = Server::start(&db, &env);
    let mut held = false;
    for _ in 0..200 {
        if db
            .scalar(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state = 'idle in transaction' AND query LIKE 'WITH picked%'",
            )
            .await
            == 1
        {
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(held, "the pruner holds its batch after the pick");
    // What a redelivery does to the older one's callback, meanwhile.
    db.exec(
        "UPDATE deliveries SET status = 'pending' \
         WHERE event_id = (SELECT id FROM events ORDER BY created_at LIMIT 1)",
    )
    .await;

    let mut saved = None;
    for _ in 0..200 {
        if db.scalar("SELECT COUNT(*) FROM retention_sweep").await == 1 {
            saved = Some(
                db.scalar("SELECT COALESCE(events_left, -1) FROM retention_sweep")
                    .await,
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(db.count("events").await, 1, "the redelivered event stays");
    assert_eq!(
        db.scalar("SELECT created_at FROM events").await,
        older,
        "and it is the older one"
    );
    assert_eq!(saved, Some(older), "the sweep notes where it left it");
}

on_both_backends!(
    an_event_passed_over_while_its_delivery_was_pending_goes_in_the_next_sweep,
    a_restarted_pruner_resumes_the_sweep_where_the_last_one_left_it,
    events_past_retention_go_with_their_deliveries_but_never_a_pending_one,
    a_backlog_past_one_runs_bound_is_pruned_without_waiting_for_the_next_tick,
    the_servers_pruner_applies_the_configured_retention,
    a_suspended_callback_keeps_its_event_past_retention_but_not_past_twice_it,
    playbook_versions_beyond_the_newest_50_go_unless_an_event_names_them,
);
