//! The fault suite's network and crash scenarios (issue 28 items 1 and 2): the connections to
//! PostgreSQL go through a fault proxy (`common::fault_proxy`) that goes silent, slows down, or
//! cuts a commit's answer; and PostgreSQL itself is SIGKILLed and restarted. Each drives the
//! real `verdict` binary under load, prints its counts, and fails when an invariant breaks.
//!
//! They run under `scripts/faults` (`VERDICT_FAULTS=short|long`; a plain `cargo test` skips
//! them), each in a PostgreSQL cluster of its own (`common::cluster`), as root or `postgres`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::cluster::Cluster;
use crate::common::fault_proxy::{Counts, FaultProxy, Mode};
use crate::common::receiver::Receiver;
use crate::common::retrying::{Tally, UNAVAILABLE_WITHIN};
use crate::common::scenario::{
    KeepLog, Load, Sent, Size, check_callbacks, check_exactly_once, check_no_key_locked_after,
    check_unavailable, first_answer_after, log_lines, probe_for, retry_probe_signals, server_env,
    start_server,
};
use crate::common::{Server, Tenant, TestDb};

/// What a scenario runs against. Fields drop in order: the server before the cluster.
struct Rig {
    server: Server,
    tenant: Tenant,
    receiver: Receiver,
    db: TestDb,
    database: String,
    cluster: Arc<Cluster>,
}

impl Rig {
    /// A cluster of the scenario's own, a database in it, a callback receiver and a tenant,
    /// and a server whose database URL is `url_of(database)` (the cluster, or a proxy to it).
    async fn start(cluster: Arc<Cluster>, url_of: impl Fn(&str) -> String) -> Rig {
        let db = TestDb::in_cluster(&cluster).await;
        let database = db.url.rsplit('/').next().unwrap().to_owned();
        let receiver = Receiver::start(Vec::new()).await;
        let tenant = db.tenant(&["--callback-url", &receiver.url]);
        let mut env = server_env();
        env.push(("VERDICT_DATABASE_URL", url_of(&database)));
        let server = start_server(&db, &env);
        Rig {
            server,
            tenant,
            receiver,
            db,
            database,
            cluster,
        }
    }

    /// A rig whose server reaches its database only through a fault proxy.
    async fn proxied(label: &str) -> (Rig, FaultProxy) {
        let cluster = Arc::new(Cluster::create(label));
        let proxy = FaultProxy::start(cluster.host()).await;
        let rig = Rig::start(cluster, |database| proxy.url(database)).await;
        (rig, proxy)
    }

    /// Starts `senders` careful senders against the server.
    fn load(&self, senders: usize, tally: &Arc<Tally>) -> Load {
        let base = Arc::new(Mutex::new(self.server.base.clone()));
        Load::start(base, &self.tenant, senders, tally.clone())
    }

    /// Every check that ends a scenario: each signal decided and acted on once, its replay
    /// the record, one row per signal in each effect table, no 5xx stored, no key unfinished,
    /// one callback per event with stable bytes. Returns the duplicates sent afterwards and
    /// the callback attempts.
    async fn check_exactly_once(&self, scenario: &str, sent: &[Sent]) -> (usize, usize) {
        let (event_ids, duplicates) =
            check_exactly_once(scenario, &self.db, &self.server, &self.tenant, sent).await;
        let attempts = check_callbacks(scenario, &self.db, &self.receiver, &event_ids).await;
        (duplicates, attempts)
    }

    /// Backends of the database busy (a statement running, a transaction open) for more than
    /// two seconds: a connection verdict left wedged.
    fn wedged_backends(&self) -> String {
        self.cluster.psql(
            &self.database,
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state <> 'idle' \
             AND now() - state_change > interval '2 seconds'",
        )
    }

    /// How long `/readyz` takes to answer 200 again, polled every 50 ms for at most 10 s.
    async fn ready_again(&self) -> Option<Duration> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let url = format!("{}/readyz", self.server.base);
            if let Ok(r) = self.server.client.get(url).send().await
                && r.status() == 200
            {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

/// The retries and duplicates a scenario's signals met, in the words every scenario prints.
fn absorbed(tally: &Tally, signals: usize, duplicates: usize) -> String {
    format!(
        "{} retries with the same key and bytes + {duplicates} duplicates sent afterwards = {} \
         duplicates absorbed; {}",
        tally.retries(signals),
        tally.retries(signals) + duplicates,
        tally.summary()
    )
}

/// The proxy stops reading and forwarding, sockets open, for seconds under load: every signal
/// and `/readyz` answers 503 (with `Retry-After`) within 2 s, bounded by the store's answer
/// deadline; once the proxy forwards again, `/readyz` is ready at once, no connection stays
/// wedged, and every signal (the probes' too, retried) completes exactly once, including those
/// whose statements the silence held and the database ran when it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_answers_503_within_two_seconds_and_wedges_nothing() {
    let scenario = "database blackhole";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(5));
    let silence = size.pick(Duration::from_secs(5), Duration::from_secs(15));
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(5));

    let (rig, proxy) = Rig::proxied("blackhole").await;
    let _log = KeepLog(&rig.server, scenario);
    let tally = Arc::new(Tally::default());
    let load = rig.load(senders, &tally);
    tokio::time::sleep(before).await;
    proxy.set(Mode::Blackhole);
    let silent_at = Instant::now();
    let probes = probe_for(&rig.server, &rig.tenant, silence).await;
    proxy.set(Mode::Forward);
    let back_at = Instant::now();
    let ready_after = rig.ready_again().await;
    tokio::time::sleep(after).await;
    let mut sent = load.finish().await;
    let load_signals = sent.len();
    sent.extend(retry_probe_signals(&rig.server, &rig.tenant, &probes, &tally).await);

    check_unavailable(
        scenario,
        "PostgreSQL silent (proxy blackholed)",
        back_at - silent_at,
        senders,
        &probes,
        &tally,
    );
    let ready_after = ready_after.unwrap_or_else(|| {
        panic!("{scenario}: /readyz was not ready within 10 s of the proxy forwarding again")
    });
    let last_conflict = check_no_key_locked_after(scenario, &tally, back_at);
    let first_after = first_answer_after(&sent, back_at);
    let signals = sent.len();
    let (duplicates, attempts) = rig.check_exactly_once(scenario, &sent).await;
    let wedged = rig.wedged_backends();
    let gave_up = log_lines(&rig.server, "Unanswered");
    eprintln!(
        "{scenario}: {signals} signals ({load_signals} under load, {} probes), 1 blackhole of {} \
         ms over {} connections (fault injected); {}",
        probes.signals.len(),
        (back_at - silent_at).as_millis(),
        Counts::get(&proxy.counts.connections),
        absorbed(&tally, signals, duplicates),
    );
    eprintln!(
        "{scenario}: {gave_up} log lines of a statement given up at its deadline; /readyz ready \
         {} ms after the proxy forwarded again, first decision {} ms after; last 409 \
         {last_conflict}; backends left busy: {wedged}; {signals} callbacks in {attempts} \
         attempts; nothing lost: {signals} of {signals} signals decided once, acted on once, \
         called back once",
        ready_after.as_millis(),
        first_after.as_millis(),
    );
    assert_eq!(wedged, "0", "{scenario}: no connection stays wedged");
    assert!(
        ready_after <= UNAVAILABLE_WITHIN,
        "{scenario}: /readyz ready {ready_after:?} after the proxy forwarded again"
    );
}

/// 50 to 200 ms added each way on every connection for a while: throughput falls, but no
/// request fails (no 503, no connection error, no retry at all) and nothing is doubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_slows_signals_and_fails_none() {
    let scenario = "slow database";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let window = size.pick(Duration::from_secs(4), Duration::from_secs(10));
    let (min_ms, max_ms) = (50, 200);

    let (rig, proxy) = Rig::proxied("slow").await;
    let _log = KeepLog(&rig.server, scenario);
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let load = rig.load(senders, &tally);
    tokio::time::sleep(window).await;
    proxy.set(Mode::Slow { min_ms, max_ms });
    let slow_at = Instant::now();
    tokio::time::sleep(window).await;
    proxy.set(Mode::Forward);
    let fast_at = Instant::now();
    tokio::time::sleep(window).await;
    let sent = load.finish().await;
    let ended = Instant::now();

    let rate = |from: Instant, to: Instant| {
        let n = sent
            .iter()
            .filter(|s| s.answered_at >= from && s.answered_at < to)
            .count();
        n as f64 / (to - from).as_secs_f64()
    };
    let (before, slow, after) = (
        rate(started, slow_at),
        rate(slow_at, fast_at),
        rate(fast_at, ended),
    );
    let signals = sent.len();
    let (duplicates, attempts) = rig.check_exactly_once(scenario, &sent).await;
    eprintln!(
        "{scenario}: {signals} signals under {senders} senders; {min_ms}-{max_ms} ms added each \
         way for {} ms over {} connections (fault injected); {}",
        (fast_at - slow_at).as_millis(),
        Counts::get(&proxy.counts.connections),
        absorbed(&tally, signals, duplicates),
    );
    eprintln!(
        "{scenario}: decisions per second {before:.0} before, {slow:.0} while slow, {after:.0} \
         after; {signals} callbacks in {attempts} attempts; nothing lost, nothing failed"
    );
    assert_eq!(
        tally.retries(signals),
        0,
        "{scenario}: a slow database fails no request: {}",
        tally.summary()
    );
    assert!(
        slow < before,
        "{scenario}: the added latency shows in the throughput ({before:.0}/s, then {slow:.0}/s)"
    );
}

/// One in four commits is cut after the server finished it and before its answer reached
/// verdict, for a while under load: the requests in those batches get a 503 (never a 200 for
/// what verdict could not confirm, never a stored 5xx), and their retries find what was
/// committed: a completed key replays its record, a rolled-back one is decided afresh, and no
/// key is ever left in flight between the two (no 409); nothing is acted on or recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_replayed_never_repeated() {
    let scenario = "ambiguous commit";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(5));
    let cutting = size.pick(Duration::from_secs(4), Duration::from_secs(15));
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(5));
    let one_in = 4;

    let (rig, proxy) = Rig::proxied("ambiguous").await;
    let _log = KeepLog(&rig.server, scenario);
    let tally = Arc::new(Tally::default());
    let load = rig.load(senders, &tally);
    tokio::time::sleep(before).await;
    proxy.set(Mode::CutCommits { one_in });
    tokio::time::sleep(cutting).await;
    proxy.set(Mode::Forward);
    tokio::time::sleep(after).await;
    let sent = load.finish().await;

    let cuts = Counts::get(&proxy.counts.cuts);
    let refused = Counts::get(&proxy.counts.cuts_refused);
    let committed = cuts - refused;
    let replayed = Tally::get(&tally.replayed_answers);
    let signals = sent.len();
    let (duplicates, attempts) = rig.check_exactly_once(scenario, &sent).await;
    eprintln!(
        "{scenario}: {signals} signals under {senders} senders; {cuts} commits cut between the \
         server finishing them and verdict hearing (faults injected; {committed} committed, \
         {refused} refused by the server) over {} connections; {}",
        Counts::get(&proxy.counts.connections),
        absorbed(&tally, signals, duplicates),
    );
    let recorded = rig.db.count("delivery_attempts").await as usize;
    eprintln!(
        "{scenario}: {replayed} signals ended with their record replayed after a lost answer; \
         {signals} callbacks in {attempts} attempts, {recorded} attempts recorded; nothing lost, \
         nothing done or recorded twice"
    );
    assert!(cuts > 0, "{scenario}: some commits were cut");
    // A fresh key's claim commits with its act, so a lost answer leaves all of the signal or
    // none of it, never a claim in flight without its effects: no retry meets a 409.
    assert_eq!(
        Tally::get(&tally.conflicts_409),
        0,
        "{scenario}: a lost answer left a key in flight"
    );
    // A cut batch may hold only inline attempts' records, so the replays are not counted
    // against the cuts one for one; that no lost answer was taken for a failure (a stored 5xx,
    // an act done again) is what the checks above hold.
    assert!(
        committed == 0 || replayed > 0,
        "{scenario}: {committed} cut commits were committed, and no retry found one"
    );
    assert_eq!(
        recorded, attempts,
        "{scenario}: an attempt whose record's answer was lost is recorded once"
    );
    // Its record sent again finds its row and succeeds, instead of failing (a duplicate key)
    // and failing with it the batch it joined.
    let unrecorded = log_lines(&rig.server, "could not record the inline delivery attempt");
    let batches_split = log_lines(&rig.server, "committing its signals one by one");
    assert_eq!(
        (unrecorded, batches_split),
        (0, 0),
        "{scenario}: a record retried after a lost answer failed, and its batch with it"
    );
}

/// PostgreSQL's postmaster and every backend SIGKILLed under load, then the same cluster
/// started and recovered: while it is down everything answers as in an outage (503 within
/// 2 s); every decision acknowledged before the crash survives it, and every signal completes
/// exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_and_restart_loses_no_acknowledged_decision() {
    let scenario = "database crash";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(5));
    let down = size.pick(Duration::from_secs(3), Duration::from_secs(10));
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(5));

    let cluster = Arc::new(Cluster::create("crash"));
    let port = cluster.port;
    let rig = Rig::start(cluster, |database| {
        format!("postgres://postgres@127.0.0.1:{port}/{database}")
    })
    .await;
    let _log = KeepLog(&rig.server, scenario);
    let tally = Arc::new(Tally::default());
    let load = rig.load(senders, &tally);
    tokio::time::sleep(before).await;
    let killing = rig.cluster.clone();
    tokio::task::spawn_blocking(move || killing.kill())
        .await
        .unwrap();
    let killed_at = Instant::now();
    let probes = probe_for(&rig.server, &rig.tenant, down).await;
    let starting = rig.cluster.clone();
    tokio::task::spawn_blocking(move || starting.start())
        .await
        .unwrap();
    let up_at = Instant::now();
    tokio::time::sleep(after).await;
    let mut sent = load.finish().await;
    let load_signals = sent.len();
    sent.extend(retry_probe_signals(&rig.server, &rig.tenant, &probes, &tally).await);

    check_unavailable(
        scenario,
        "PostgreSQL killed",
        up_at - killed_at,
        senders,
        &probes,
        &tally,
    );
    let events: std::collections::BTreeSet<String> = rig
        .cluster
        .psql(&rig.database, "SELECT id FROM events")
        .lines()
        .map(str::to_owned)
        .collect();
    let acknowledged_before: Vec<&Sent> =
        sent.iter().filter(|s| s.answered_at < killed_at).collect();
    let lost = acknowledged_before
        .iter()
        .filter(|s| !events.contains(s.reply.json()["event_id"].as_str().unwrap()))
        .count();
    assert_eq!(
        lost, 0,
        "{scenario}: decisions acknowledged before the crash are missing after recovery"
    );
    let last_conflict = check_no_key_locked_after(scenario, &tally, up_at);
    let first_after = first_answer_after(&sent, up_at);
    let signals = sent.len();
    let (duplicates, attempts) = rig.check_exactly_once(scenario, &sent).await;
    eprintln!(
        "{scenario}: {signals} signals ({load_signals} under load, {} probes); postmaster and \
         every backend SIGKILLed, restarted {} ms later (faults injected: 1 crash, 1 restart \
         with recovery); {}",
        probes.signals.len(),
        (up_at - killed_at).as_millis(),
        absorbed(&tally, signals, duplicates),
    );
    eprintln!(
        "{scenario}: {} decisions acknowledged before the crash, every one there after recovery; \
         first decision {} ms after the restart; last 409 {last_conflict}; {signals} callbacks \
         in {attempts} attempts; nothing lost",
        acknowledged_before.len(),
        first_after.as_millis(),
    );
}
