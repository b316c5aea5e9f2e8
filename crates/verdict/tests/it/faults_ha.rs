//! The fault suite's high-availability scenarios: a failover decided by a real orchestrator
//! (`pg_auto_failover`: a monitor and two nodes in synchronous replication), and three
//! instances through a real pooler (PgBouncer). Each drives the real `verdict` binary over real
//! sockets, prints its counts, and fails when an invariant breaks.
//!
//! They run under `scripts/faults` (which installs Debian's `pgbouncer` and
//! `postgresql-NN-auto-failover` when missing); a plain `cargo test` skips them, as it does
//! `faults.rs`, because they start PostgreSQL servers of their own, which needs root or the
//! `postgres` user.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, postgres::PgConnectOptions};

use crate::common::TestDb;
use crate::common::autofailover::Formation;
use crate::common::cluster::{Cluster, psql};
use crate::common::pgbouncer::{PgBouncer, PoolMode};
use crate::common::receiver::Receiver;
use crate::common::retrying::Tally;
use crate::common::scenario::{
    AfterFailover, KeepLog, Load, Sent, Size, check_callbacks, check_exactly_once, check_failover,
    log_lines, server_env, start_server,
};

/// pg_auto_failover runs the failover: the primary node (its keeper, postmaster and every
/// backend) is SIGKILLed under load, and the monitor, not the test, promotes the synchronous
/// standby. The server, given both nodes, follows without a restart, and every decision a
/// client got a 200 for is on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_run_by_pg_auto_failover_loses_no_acknowledged_decision() {
    let scenario = "pg_auto_failover failover";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(3), Duration::from_secs(10));
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(10));

    let created = Instant::now();
    let mut formation = tokio::task::spawn_blocking(|| Formation::create("autofailover"))
        .await
        .unwrap();
    let set_up_in = created.elapsed();
    let sync_names = formation.synchronous_standby_names(0);
    assert!(
        sync_names.starts_with("ANY 1 ("),
        "{scenario}: the monitor made the standby synchronous, not `{sync_names}`"
    );
    let mut db = TestDb::in_server(&formation.nodes[0].url("postgres")).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let both = format!(
        "postgres://postgres@{},{}/{database}",
        formation.nodes[0].host(),
        formation.nodes[1].host()
    );
    let mut env = server_env();
    env.push(("VERDICT_DATABASE_URL", both));
    let server = start_server(&db, &env);
    let _log = KeepLog(&server, scenario);
    let base = Arc::new(Mutex::new(server.base.clone()));
    let tally = Arc::new(Tally::default());
    let load = Load::start(base, &tenant, senders, tally.clone());

    tokio::time::sleep(before).await;
    let (formation_back, killed) = tokio::task::spawn_blocking(move || {
        let killed = formation.kill_node(0);
        (formation, killed)
    })
    .await
    .unwrap();
    formation = formation_back;
    let killed_at = Instant::now();
    let formation = Arc::new(formation);
    let waiting = formation.clone();
    tokio::task::spawn_blocking(move || waiting.wait_until_primary(1))
        .await
        .unwrap();
    let promoted_at = Instant::now();
    tokio::time::sleep(after).await;
    let sent = load.finish().await;

    // The old primary is gone: everything is checked on the node the monitor promoted.
    let new_primary = &formation.nodes[1];
    db.url = new_primary.url(&database);
    let on_new_primary: BTreeSet<String> =
        psql(new_primary.port, &database, "SELECT id FROM events")
            .lines()
            .map(str::to_owned)
            .collect();
    let AfterFailover {
        acknowledged_before_kill,
        resumed,
        first_after,
    } = check_failover(scenario, &sent, &on_new_primary, killed_at, promoted_at);
    let (event_ids, duplicates) = check_exactly_once(scenario, &db, &server, &tenant, &sent).await;
    let attempts = check_callbacks(scenario, &db, &receiver, &event_ids).await;
    let switched = log_lines(&server, "database failover: new connections go to");
    let promotions = formation.promotions();
    let signals = sent.len();
    eprintln!(
        "{scenario}: formation (monitor, primary, synchronous standby: {sync_names}) set up in \
         {} s; {signals} signals under {senders} senders; the primary node SIGKILLed whole \
         ({killed} processes), the monitor promoted the standby {} ms later (faults injected: \
         1 node crash; promotions the monitor logged: {promotions}); {} retries with the same \
         key and bytes + {duplicates} duplicates sent afterwards = {} duplicates absorbed; {}",
        set_up_in.as_secs(),
        (promoted_at - killed_at).as_millis(),
        tally.retries(signals),
        tally.retries(signals) + duplicates,
        tally.summary(),
    );
    eprintln!(
        "{scenario}: {acknowledged_before_kill} decisions acknowledged before the kill, \
         {signals} in all, every one on the promoted node; first answer {} ms after the \
         promotion, {resumed} after it, same process; the server switched hosts {switched} \
         time(s); {signals} callbacks in {attempts} attempts; nothing lost",
        first_after.as_millis(),
    );
    assert!(
        killed >= 3,
        "{scenario}: the kill reached the supervisor, the keeper and the postmaster ({killed})"
    );
    assert_eq!(
        promotions,
        1,
        "{scenario}: the monitor promoted once; its events:\n{}",
        formation.events()
    );
    assert_eq!(
        switched, 1,
        "{scenario}: the server followed the failover once"
    );
}

/// verdict's PostgreSQL connections per process at most (`store/postgres.rs`, `CONNECTIONS`).
const CONNECTIONS_PER_INSTANCE: u32 = 16;

/// Server connections PgBouncer may open to the database (`default_pool_size`): what the three
/// instances' pools may hold at once. In session mode a client connection keeps its server
/// connection until it disconnects, and verdict's pools keep theirs open, so a pool smaller
/// than the instances' starves one of them (measured with 24: one instance answered 503 to
/// 510 of 515 signals, its connections queued at the pooler; docs/reliability.md).
const POOLED_SERVER_CONNECTIONS: u32 = 3 * CONNECTIONS_PER_INSTANCE;

/// Sets a flag when dropped, so a sampling thread stops when its test ends, failed or not (the
/// runtime waits for blocking threads at its end).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Three instances through PgBouncer in session mode (why not transaction mode: the test below
/// and docs/reliability.md): every signal decided exactly once, one callback each, no signal
/// meeting a 503, and the server's connections to the database, sampled all along under
/// load, never above the pooler's `default_pool_size`. Also: the pools' planning and JIT
/// settings hold through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_through_pgbouncer_stay_within_its_pool_and_lose_nothing() {
    let scenario = "three instances through PgBouncer";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders_each = size.pick(3, 8);
    let run_for = size.pick(Duration::from_secs(8), Duration::from_secs(30));

    let cluster = Arc::new(Cluster::create("pooled"));
    let bouncer = Arc::new(PgBouncer::start(
        "pgbouncer",
        cluster.port,
        PoolMode::Session,
        POOLED_SERVER_CONNECTIONS,
    ));
    let db = TestDb::in_cluster(&cluster).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);

    // PgBouncer refuses the startup packet's `options`: the pools set their planning and
    // JIT with `SET` once connected instead, which a session keeps.
    let store = verdict::store::PostgresStore::connect(&bouncer.url(&database))
        .await
        .expect("verdict's store connects through PgBouncer");
    let show = |pool: &sqlx::PgPool, setting: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
                .fetch_one(&pool)
                .await
                .expect("a pooled connection answers")
        }
    };
    assert_eq!(
        show(store.decisions(), "plan_cache_mode").await,
        "force_generic_plan"
    );
    assert_eq!(
        show(store.read(), "plan_cache_mode").await,
        "auto",
        "only the pipeline's plan"
    );
    assert_eq!(show(store.read(), "jit").await, "off");
    assert_eq!(show(store.decisions(), "jit").await, "off");
    store.decisions().close().await;
    store.read().close().await;
    drop(store);

    let mut env = server_env();
    env.push(("VERDICT_DATABASE_URL", bouncer.url(&database)));
    let servers: Vec<_> = (0..3).map(|_| start_server(&db, &env)).collect();
    let names: Vec<String> = (1..=3).map(|i| format!("{scenario} ({i})")).collect();
    let _logs: Vec<_> = servers
        .iter()
        .zip(&names)
        .map(|(s, n)| KeepLog(s, n))
        .collect();

    // Samples the server's connections to the database and the pooler's clients.
    let sampling = Arc::new(AtomicBool::new(true));
    let stop_sampling = StopOnDrop(sampling.clone());
    let (peak_server, peak_clients, peak_waiting) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
    );
    let sampler = {
        let (cluster, bouncer, database, sampling) = (
            cluster.clone(),
            bouncer.clone(),
            database.clone(),
            sampling.clone(),
        );
        let (peak_server, peak_clients, peak_waiting) = (
            peak_server.clone(),
            peak_clients.clone(),
            peak_waiting.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let mut samples = 0;
            while sampling.load(Ordering::SeqCst) {
                let server: u32 = cluster
                    .psql(
                        "postgres",
                        &format!(
                            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '{database}'"
                        ),
                    )
                    .parse()
                    .unwrap();
                let (clients, waiting) = bouncer.clients(&database);
                peak_server.fetch_max(server, Ordering::SeqCst);
                peak_clients.fetch_max(clients + waiting, Ordering::SeqCst);
                peak_waiting.fetch_max(waiting, Ordering::SeqCst);
                samples += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };

    let tally = Arc::new(Tally::default());
    let loads: Vec<Load> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let base = Arc::new(Mutex::new(s.base.clone()));
            let numbers = i * senders_each..(i + 1) * senders_each;
            Load::start_from(base, &tenant, numbers, tally.clone())
        })
        .collect();
    tokio::time::sleep(run_for).await;
    // All three stop at once (each waits for its senders' last answers).
    let finishing: Vec<_> = loads
        .into_iter()
        .map(|load| tokio::spawn(load.finish()))
        .collect();
    let mut sent: Vec<Sent> = Vec::new();
    let mut per_instance = Vec::new();
    for finished in finishing {
        let these = finished.await.unwrap();
        per_instance.push(these.len());
        sent.extend(these);
    }
    // Sampled under load only: the checks below connect to the database directly.
    drop(stop_sampling);
    let samples = sampler.await.unwrap();
    // The duplicate of every signal goes through one instance, still through the pooler.
    let (event_ids, duplicates) =
        check_exactly_once(scenario, &db, &servers[0], &tenant, &sent).await;
    let attempts = check_callbacks(scenario, &db, &receiver, &event_ids).await;
    let (peak_server, peak_clients, peak_waiting) = (
        peak_server.load(Ordering::SeqCst),
        peak_clients.load(Ordering::SeqCst),
        peak_waiting.load(Ordering::SeqCst),
    );
    let signals = sent.len();
    eprintln!(
        "{scenario}: {signals} signals ({per_instance:?} per instance) under {} senders; \
         pooler in session mode, default_pool_size {POOLED_SERVER_CONNECTIONS}, instances' \
         pools 3 × {CONNECTIONS_PER_INSTANCE}; {samples} samples: at most {peak_server} server connections to the \
         database, {peak_clients} pooler clients ({peak_waiting} waiting at most) (faults \
         injected: none, the pooler is the subject); {} retries with the same key and bytes + \
         {duplicates} duplicates sent afterwards = {} duplicates absorbed; {}",
        3 * senders_each,
        tally.retries(signals),
        tally.retries(signals) + duplicates,
        tally.summary(),
    );
    eprintln!(
        "{scenario}: {signals} callbacks in {attempts} attempts, one webhook-id each; nothing lost"
    );
    assert!(samples > 0, "{scenario}: the connections were sampled");
    assert!(
        peak_server > 0,
        "{scenario}: the sampler saw the instances' connections on the server"
    );
    assert!(
        peak_server <= POOLED_SERVER_CONNECTIONS,
        "{scenario}: the server had {peak_server} connections to the database, over the \
         pooler's {POOLED_SERVER_CONNECTIONS}"
    );
    assert_eq!(
        Tally::get(&tally.unavailable_503) + Tally::get(&tally.connection_errors),
        0,
        "{scenario}: no signal met an unavailable database through the pooler"
    );
}

/// Why the pooler runs in session mode: through PgBouncer 1.18 (Debian bookworm's) in
/// transaction mode, sqlx's statements fail even with its statement cache off
/// (`statement_cache_capacity(0)`). sqlx still names every statement it prepares (`sqlx_s_N`,
/// numbered per client connection), and with no cache never closes it; the pooler hands one
/// server connection to client after client, so the second client's `sqlx_s_1` meets the
/// first's. (An unnamed statement would not help either: sqlx sends its Parse and its Bind
/// after separate Syncs, between which the pooler may switch server connections.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_statements_fail_through_pgbouncer_transaction_pooling_even_uncached() {
    let scenario = "PgBouncer transaction pooling";
    let Some(_) = Size::from_env(scenario) else {
        return;
    };
    let cluster = Cluster::create("txpool");
    let bouncer = PgBouncer::start("txpool-bouncer", cluster.port, PoolMode::Transaction, 1);
    let options = PgConnectOptions::from_str(&bouncer.url("postgres"))
        .unwrap()
        .statement_cache_capacity(0);
    let mut first = options.connect().await.expect("connects through PgBouncer");
    let mut second = options.connect().await.expect("connects through PgBouncer");
    let query = || sqlx::query_scalar::<_, i64>("SELECT $1::int8").bind(7_i64);
    assert_eq!(query().fetch_one(&mut first).await.unwrap(), 7);
    let err = query()
        .fetch_one(&mut second)
        .await
        .expect_err("a second client's statement meets the first's on the one server connection");
    let code = err
        .as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned());
    eprintln!(
        "{scenario}: the second client's uncached statement failed: {err} (SQLSTATE {code:?}); \
         verdict uses session mode"
    );
    assert_eq!(
        code.as_deref(),
        Some("42P05"),
        "{scenario}: duplicate_prepared_statement, not {err}"
    );
}
