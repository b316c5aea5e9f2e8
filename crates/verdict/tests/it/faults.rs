//! The fault suite's scenarios besides the crash storm (`tests/it/crash_storm.rs`): a database
//! outage, a database failover, and a duplicate storm. Each drives the real `verdict` binary
//! over real sockets, prints its counts, and fails when an invariant breaks.
//!
//! They run under `scripts/faults`, which sets `VERDICT_FAULTS` to `short` (CI-sized) or `long`;
//! a plain `cargo test` skips them, because the outage and failover scenarios create, stop, kill
//! and promote PostgreSQL clusters of their own (`common::cluster`), which needs root or the
//! `postgres` user, and the long sizes take minutes.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::cluster::Cluster;
use crate::common::receiver::{Receiver, Step};
use crate::common::retrying::{
    SIM_SWAP_ACTIONS, Tally, action_outcomes, send_until_answered, wrong_sim_swap_answer,
};
use crate::common::scenario::{
    AfterFailover, KeepLog, Load, SIGNAL_DEADLINE, Size, check_callbacks, check_exactly_once,
    check_failover, check_no_key_locked_after, check_unavailable, first_answer_after, log_lines,
    probe_for, retry_probe_signals, server_env, start_server,
};
use crate::common::{Backend, Reply, TestDb, new_key, random_between, sim_swap};

/// The database stopped under load for several seconds, then started: while it is down,
/// `/healthz` answers 200, `/readyz` 503 and signals 503 with `Retry-After`, each within 2 s;
/// afterwards every retried signal completes exactly once, no key holds a stored 5xx or stays
/// locked past the lock timeout, the callbacks queued meanwhile go out, and the worker logged
/// the outage once, not once per round or row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_answers_503_at_once_and_loses_nothing() {
    let scenario = "database outage";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(5));
    let outage = size.pick(Duration::from_secs(4), Duration::from_secs(15));
    let after = size.pick(Duration::from_secs(2), Duration::from_secs(5));

    let cluster = Arc::new(Cluster::create("outage"));
    let db = TestDb::in_cluster(&cluster).await;
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = start_server(&db, &server_env());
    let _log = KeepLog(&server, scenario);
    let base = Arc::new(Mutex::new(server.base.clone()));
    let tally = Arc::new(Tally::default());
    let load = Load::start(base, &tenant, senders, tally.clone());

    tokio::time::sleep(before).await;
    // Callbacks fail for the second before the outage: they are queued for the worker, which
    // meets the outage when their retry comes due (the receiver is fine again by then).
    receiver.answer_by_default(Step::status(503));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopping = cluster.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap();
    let down_at = Instant::now();
    receiver.answer_by_default(Step::status(200));
    let probes = probe_for(&server, &tenant, outage).await;
    let starting = cluster.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap();
    let up_at = Instant::now();
    let down_for = up_at - down_at;
    tokio::time::sleep(after).await;
    let mut sent = load.finish().await;
    let load_signals = sent.len();

    // The probes' signals, retried now with the same key and bytes.
    sent.extend(retry_probe_signals(&server, &tenant, &probes, &tally).await);
    check_unavailable(
        scenario,
        "PostgreSQL down",
        down_for,
        senders,
        &probes,
        &tally,
    );

    // Afterwards.
    let last_conflict = check_no_key_locked_after(scenario, &tally, up_at);
    let first_after = first_answer_after(&sent, up_at);
    let signals = sent.len();
    let (event_ids, duplicates) = check_exactly_once(scenario, &db, &server, &tenant, &sent).await;
    eprintln!(
        "{scenario}: {signals} signals ({load_signals} under load, {} probes), 1 outage of {} ms \
         (fault injected); {} retries with the same key and bytes + {duplicates} duplicates \
         sent afterwards = {} duplicates absorbed; {}",
        probes.signals.len(),
        down_for.as_millis(),
        tally.retries(signals),
        tally.retries(signals) + duplicates,
        tally.summary(),
    );
    let attempts = check_callbacks(scenario, &db, &receiver, &event_ids).await;
    let queued = db
        .scalar(
            "SELECT COUNT(DISTINCT delivery_id) FROM delivery_attempts \
             WHERE trigger_kind = 'worker'",
        )
        .await;
    let worker_outage_logs = log_lines(&server, "delivery rounds back off");
    let per_row_logs = log_lines(&server, "could not record a delivery attempt");
    let round_failures = log_lines(&server, "delivery round failed");
    eprintln!(
        "{scenario}: first decision {} ms after the database returned; last 409 {last_conflict}; \
         {queued} callbacks queued for the worker, {signals} delivered in {attempts} attempts; \
         the worker logged the outage {worker_outage_logs} time(s), {round_failures} failed \
         rounds, {per_row_logs} per-row record failures; nothing lost: {signals} of {signals} \
         signals decided once, acted on once, called back once",
        first_after.as_millis(),
    );
    assert!(
        queued > 0,
        "{scenario}: some callbacks waited for the worker"
    );
    assert_eq!(
        worker_outage_logs, 1,
        "{scenario}: the worker logs the outage once"
    );
    assert_eq!(
        per_row_logs + round_failures,
        0,
        "{scenario}: the worker logs no failure per round or per row during an outage"
    );
}

/// A primary with a synchronous standby; the primary is SIGKILLed under load and the standby
/// promoted. The server, given both hosts, resumes on the promoted standby without a restart,
/// and every decision a client got a 200 for is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_synchronous_standby_loses_no_acknowledged_decision() {
    let scenario = "database failover";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(3), Duration::from_secs(10));
    let noticed = Duration::from_secs(1);
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(10));

    let primary = Arc::new(Cluster::create("primary"));
    let standby = Arc::new(Cluster::standby_of(&primary, "standby"));
    primary.make_standby_synchronous();
    primary.wait_for_synchronous_standby();
    let mut db = TestDb::in_cluster(&primary).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let both = format!(
        "postgres://postgres@{},{}/{database}",
        primary.host(),
        standby.host()
    );
    let mut env = server_env();
    env.push(("VERDICT_DATABASE_URL", both));
    let server = start_server(&db, &env);
    let _log = KeepLog(&server, scenario);
    let base = Arc::new(Mutex::new(server.base.clone()));
    let tally = Arc::new(Tally::default());
    let load = Load::start(base, &tenant, senders, tally.clone());

    tokio::time::sleep(before).await;
    let killing = primary.clone();
    tokio::task::spawn_blocking(move || killing.kill())
        .await
        .unwrap();
    let killed_at = Instant::now();
    // The time a failover manager takes to notice, then the promotion.
    tokio::time::sleep(noticed).await;
    let promoting = standby.clone();
    tokio::task::spawn_blocking(move || promoting.promote())
        .await
        .unwrap();
    let promoted_at = Instant::now();
    tokio::time::sleep(after).await;
    let sent = load.finish().await;

    // The primary is gone: everything is checked on the promoted standby.
    db.url = standby.url(&database);
    let on_standby: BTreeSet<String> = standby
        .psql(&database, "SELECT id FROM events")
        .lines()
        .map(str::to_owned)
        .collect();
    let AfterFailover {
        acknowledged_before_kill,
        resumed,
        first_after,
    } = check_failover(scenario, &sent, &on_standby, killed_at, promoted_at);
    let (event_ids, duplicates) = check_exactly_once(scenario, &db, &server, &tenant, &sent).await;
    let attempts = check_callbacks(scenario, &db, &receiver, &event_ids).await;
    let switched = log_lines(&server, "database failover: new connections go to");
    let signals = sent.len();
    eprintln!(
        "{scenario}: {signals} signals under {senders} senders; primary SIGKILLed and standby \
         promoted {} ms later (faults injected: 1 kill, 1 promotion); {} retries with the same \
         key and bytes + {duplicates} duplicates sent afterwards = {} duplicates absorbed; {}",
        (promoted_at - killed_at).as_millis(),
        tally.retries(signals),
        tally.retries(signals) + duplicates,
        tally.summary(),
    );
    eprintln!(
        "{scenario}: {} decisions acknowledged before the kill, {signals} in all, every one on \
         the promoted standby; first answer {} ms after the promotion, {resumed} after it, same \
         process; the server switched hosts {switched} time(s); {signals} callbacks in \
         {attempts} attempts; nothing lost",
        acknowledged_before_kill,
        first_after.as_millis(),
    );
    assert_eq!(
        switched, 1,
        "{scenario}: the server followed the failover once"
    );
}

on_both_backends!(a_duplicate_storm_has_one_effect_per_signal);

/// Thousands of requests: each signal sent 1 to 20 times at once, two thirds with a key (the
/// same on every copy) and a third without. Keyed: one event, one fresh answer, every copy the
/// same record. Keyless: an event per copy, but each action done by exactly one of them, and
/// one row per signal in every effect table, one callback per signal.
async fn a_duplicate_storm_has_one_effect_per_signal(backend: Backend) {
    let scenario = format!("duplicate storm ({backend:?})");
    let Some(size) = Size::from_env(&scenario) else {
        return;
    };
    let signals = size.pick(240, 2400);
    let at_once = size.pick(8, 16);

    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = start_server(&db, &server_env());
    let _log = KeepLog(&server, &scenario);
    let base = Arc::new(Mutex::new(server.base.clone()));
    let tally = Arc::new(Tally::default());
    let client = common::retrying::client();
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let started = Instant::now();

    let mut storms = Vec::new();
    for i in 0..signals {
        let keyed = i % 3 != 2;
        let copies = random_between(1, 20) as usize;
        let key = keyed.then(new_key);
        let body = sim_swap(&format!("+4477{i:08}"));
        let (base, tenant, tally, client, gate) = (
            base.clone(),
            tenant.clone(),
            tally.clone(),
            client.clone(),
            gate.clone(),
        );
        storms.push(tokio::spawn(async move {
            let _turn = gate.acquire_owned().await.unwrap();
            let mut copies_sent = tokio::task::JoinSet::new();
            for _ in 0..copies {
                let (base, tenant, tally, client, key, body) = (
                    base.clone(),
                    tenant.clone(),
                    tally.clone(),
                    client.clone(),
                    key.clone(),
                    body.clone(),
                );
                copies_sent.spawn(async move {
                    send_until_answered(
                        &client,
                        &base,
                        &tenant,
                        key.as_deref(),
                        &body,
                        &tally,
                        SIGNAL_DEADLINE,
                    )
                    .await
                });
            }
            let replies: Vec<Reply> = copies_sent.join_all().await;
            (key, replies)
        }));
    }
    let mut results = Vec::new();
    for storm in storms {
        results.push(storm.await.unwrap());
    }
    let took = started.elapsed();

    let mut keyed_signals = 0;
    let mut keyless_events = 0;
    let mut requests = 0;
    let mut event_ids = BTreeSet::new();
    for (key, replies) in &results {
        requests += replies.len();
        for reply in replies {
            assert_eq!(
                reply.status,
                200,
                "{scenario}: {}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(reply.json()["decision"], "deny", "{scenario}");
        }
        let ids: BTreeSet<String> = replies
            .iter()
            .map(|r| r.json()["event_id"].as_str().unwrap().to_owned())
            .collect();
        match key {
            Some(key) => {
                keyed_signals += 1;
                assert_eq!(ids.len(), 1, "{scenario}: key {key}: one event");
                let fresh: Vec<&Reply> = replies.iter().filter(|r| !r.replayed()).collect();
                assert_eq!(
                    fresh.len(),
                    1,
                    "{scenario}: key {key}: one copy processed, the rest replayed"
                );
                if let Some(wrong) = wrong_sim_swap_answer(fresh[0]) {
                    panic!("{scenario}: key {key}: {wrong}");
                }
                assert!(
                    replies.iter().all(|r| r.json() == fresh[0].json()),
                    "{scenario}: key {key}: every copy gets the same record"
                );
                event_ids.extend(ids);
            }
            None => {
                assert_eq!(
                    ids.len(),
                    replies.len(),
                    "{scenario}: without a key, each copy is its own event"
                );
                keyless_events += replies.len();
                // Each effect done by exactly one copy; the others find it already done.
                let mut done: HashMap<String, usize> = HashMap::new();
                for reply in replies {
                    for (action, outcome) in action_outcomes(&reply.json()) {
                        assert!(
                            outcome == "done" || outcome == "already_done",
                            "{scenario}: {action}: {outcome}"
                        );
                        if outcome == "done" {
                            *done.entry(action).or_default() += 1;
                        }
                    }
                }
                for action in SIM_SWAP_ACTIONS {
                    assert_eq!(
                        done.get(action).copied().unwrap_or(0),
                        1,
                        "{scenario}: a keyless signal sent {} times: {action} done once, by {:?}",
                        replies.len(),
                        replies
                            .iter()
                            .map(|r| action_outcomes(&r.json()))
                            .collect::<Vec<_>>()
                    );
                }
                // The copy that did the callback is the event the callback names.
                let caller = replies
                    .iter()
                    .find(|r| {
                        action_outcomes(&r.json())
                            .iter()
                            .any(|(a, o)| a == "callback" && o == "done")
                    })
                    .unwrap();
                event_ids.insert(caller.json()["event_id"].as_str().unwrap().to_owned());
            }
        }
    }
    let n = signals as i64;
    let rows = [
        ("account_locks", db.count("account_locks").await, n),
        ("cases", db.count("cases").await, n),
        ("alert_windows", db.count("alert_windows").await, n),
        ("denies", db.count("denies").await, n),
        ("deliveries", db.count("deliveries").await, n),
        (
            "events",
            db.count("events").await,
            (keyed_signals + keyless_events) as i64,
        ),
    ];
    let attempts = check_callbacks(&scenario, &db, &receiver, &event_ids).await;
    eprintln!(
        "{scenario}: {signals} signals ({keyed_signals} keyed, {} keyless), {requests} requests \
         in {} ms (each signal 1–20 copies at once, {at_once} signals at a time): {} duplicates \
         absorbed ({} keyed copies replayed, {} keyless copies found every effect done); {}",
        signals - keyed_signals,
        took.as_millis(),
        requests - signals,
        results
            .iter()
            .filter(|(k, _)| k.is_some())
            .map(|(_, r)| r.len() - 1)
            .sum::<usize>(),
        keyless_events - (signals - keyed_signals),
        tally.summary(),
    );
    eprintln!(
        "{scenario}: rows per table: {}; {signals} callbacks in {attempts} attempts; nothing \
         lost, nothing repeated",
        rows.iter()
            .map(|(t, c, _)| format!("{t} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (table, count, expected) in rows {
        assert_eq!(count, expected, "{scenario}: {table}");
    }
}
