//! What the fault scenarios share (`faults`, `faults_network`): their size, the server they
//! start, the load of careful senders, the probes taken while the fault lasts, and the
//! end-of-run invariants every scenario checks (exactly once, one callback per event with
//! stable bytes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::receiver::Receiver;
use super::retrying::{Tally, UNAVAILABLE_WITHIN, send_until_answered, wrong_sim_swap_answer};
use super::{Reply, Server, Tenant, TestDb, new_key, signed, sim_swap};

/// How big a run is: `VERDICT_FAULTS=short` for CI, `long` for a person; unset skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Short,
    Long,
}

impl Size {
    pub fn from_env(scenario: &str) -> Option<Size> {
        match std::env::var("VERDICT_FAULTS").as_deref() {
            Ok("short") => Some(Size::Short),
            Ok("long") => Some(Size::Long),
            Ok(other) => panic!("VERDICT_FAULTS is `short` or `long`, not `{other}`"),
            Err(_) => {
                eprintln!("{scenario}: skipped (run it with scripts/faults)");
                None
            }
        }
    }

    pub fn pick<T>(self, short: T, long: T) -> T {
        match self {
            Size::Short => short,
            Size::Long => long,
        }
    }
}

/// Gives up on a signal after this long.
pub const SIGNAL_DEADLINE: Duration = Duration::from_secs(180);
/// The lock timeout the outage and failover servers run with: short enough that a key left
/// locked would show, long enough that a live holder on a busy machine never overruns it.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// A server's environment in these scenarios: callbacks to this machine, and the worker
/// inside `serve` retrying every second.
pub fn server_env() -> Vec<(&'static str, String)> {
    vec![
        ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1".into()),
        ("VERDICT_RETRY_INTERVAL_SECS", "1".into()),
        (
            "VERDICT_LOCK_TIMEOUT_SECS",
            LOCK_TIMEOUT.as_secs().to_string(),
        ),
    ]
}

pub fn start_server(db: &TestDb, env: &[(&'static str, String)]) -> Server {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start(db, &env)
}

/// One signal a sender got a final answer for.
pub struct Sent {
    pub key: String,
    pub body: String,
    pub reply: Reply,
    pub answered_at: Instant,
}

/// Senders that each send fresh keyed SIM swaps one after another, each until it gets a final
/// answer (same key, same bytes), until stopped.
pub struct Load {
    senders: Vec<tokio::task::JoinHandle<Vec<Sent>>>,
    stop: Arc<AtomicBool>,
}

impl Load {
    pub fn start(
        base: Arc<Mutex<String>>,
        tenant: &Tenant,
        senders: usize,
        tally: Arc<Tally>,
    ) -> Load {
        Load::start_from(base, tenant, 0..senders, tally)
    }

    /// Like [`Load::start`], with the senders numbered `senders` (each sender's subjects are
    /// its own, so loads sent to several instances at once need numbers apart).
    pub fn start_from(
        base: Arc<Mutex<String>>,
        tenant: &Tenant,
        senders: std::ops::Range<usize>,
        tally: Arc<Tally>,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let senders = senders
            .map(|s| {
                let (base, tenant, tally, stop) =
                    (base.clone(), tenant.clone(), tally.clone(), stop.clone());
                tokio::spawn(async move {
                    let client = super::retrying::client();
                    let mut sent = Vec::new();
                    for n in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let key = new_key();
                        let body = sim_swap(&format!("+447{s:03}{n:06}"));
                        let reply = send_until_answered(
                            &client,
                            &base,
                            &tenant,
                            Some(&key),
                            &body,
                            &tally,
                            SIGNAL_DEADLINE,
                        )
                        .await;
                        sent.push(Sent {
                            key,
                            body,
                            reply,
                            answered_at: Instant::now(),
                        });
                    }
                    sent
                })
            })
            .collect();
        Load { senders, stop }
    }

    /// Stops sending new signals and waits for every signal sent to be answered.
    pub async fn finish(self) -> Vec<Sent> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        for sender in self.senders {
            all.extend(sender.await.unwrap());
        }
        all
    }
}

/// Every answer a fresh SIM swap must get, one event per signal, each key replayed from its
/// record, no key left in flight or holding a stored 5xx. Returns the event ids and the
/// duplicates sent to check the replays.
pub async fn check_exactly_once(
    scenario: &str,
    db: &TestDb,
    server: &Server,
    tenant: &Tenant,
    sent: &[Sent],
) -> (BTreeSet<String>, usize) {
    let wrong: Vec<String> = sent
        .iter()
        .filter_map(|s| wrong_sim_swap_answer(&s.reply).map(|w| format!("{}: {w}", s.key)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{scenario}: {} of {} signals did not end with deny by recent_sim_swap and every action done:\n{}",
        wrong.len(),
        sent.len(),
        wrong.join("\n")
    );
    let event_ids: BTreeSet<String> = sent
        .iter()
        .map(|s| s.reply.json()["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        event_ids.len(),
        sent.len(),
        "{scenario}: one event per signal"
    );

    // A deliberate duplicate of every signal: answered from the record, byte for byte.
    for s in sent {
        let again = server.send(tenant, Some(&s.key), &s.body).await;
        assert_eq!(again.status, 200, "{scenario}: {}", s.key);
        assert!(again.replayed(), "{scenario}: {} is replayed", s.key);
        assert_eq!(
            again.json(),
            s.reply.json(),
            "{scenario}: the replay is the record"
        );
    }

    let n = sent.len() as i64;
    let rows = [
        ("events", db.count("events").await),
        ("account_locks", db.count("account_locks").await),
        ("cases", db.count("cases").await),
        ("alert_windows", db.count("alert_windows").await),
        ("denies", db.count("denies").await),
        ("deliveries", db.count("deliveries").await),
    ];
    eprintln!(
        "{scenario}: rows per table: {}",
        rows.iter()
            .map(|(t, c)| format!("{t} {c}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (table, count) in rows {
        assert_eq!(count, n, "{scenario}: {table} must hold one row per signal");
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys WHERE response_status >= 500")
            .await,
        0,
        "{scenario}: a 5xx was stored on a key"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM idempotency_keys WHERE state <> 'completed'")
            .await,
        0,
        "{scenario}: a key was left unfinished"
    );
    (event_ids, sent.len())
}

/// Waits until every delivery has succeeded, then checks that every event got exactly one
/// callback (one webhook-id) whose bytes never changed between attempts. Returns the attempts
/// the receiver got.
pub async fn check_callbacks(
    scenario: &str,
    db: &TestDb,
    receiver: &Receiver,
    event_ids: &BTreeSet<String>,
) -> usize {
    let n = event_ids.len() as i64;
    let started = Instant::now();
    // An inline attempt whose record the fault cut off waits out its lease (60 s) first.
    while db
        .scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'succeeded'")
        .await
        < n
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{scenario}: callbacks still undelivered after 120 s: {} of {n} succeeded",
            db.scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'succeeded'")
                .await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut by_webhook: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for r in receiver.received() {
        by_webhook
            .entry(r.header("webhook-id").to_owned())
            .or_default()
            .push(r.body);
    }
    let mut called_back = BTreeSet::new();
    let mut attempts = 0;
    for (id, bodies) in &by_webhook {
        attempts += bodies.len();
        assert!(
            bodies.iter().all(|b| b == &bodies[0]),
            "{scenario}: webhook-id {id}: the callback bytes changed between attempts"
        );
        let envelope: Value = serde_json::from_slice(&bodies[0]).unwrap();
        assert!(
            called_back.insert(envelope["event_id"].as_str().unwrap().to_owned()),
            "{scenario}: two webhook-ids for event {}",
            envelope["event_id"]
        );
    }
    assert_eq!(
        &called_back, event_ids,
        "{scenario}: every event got its callback, and no other"
    );
    attempts
}

/// How many log lines contain `needle`.
pub fn log_lines(server: &Server, needle: &str) -> usize {
    server.logs().lines().filter(|l| l.contains(needle)).count()
}

/// Keeps the server's log (`common::keep_log`) when the scenario ends, passed or failed.
pub struct KeepLog<'a>(pub &'a Server, pub &'a str);

impl Drop for KeepLog<'_> {
    fn drop(&mut self) {
        super::keep_log(self.1, &self.0.logs());
    }
}

/// What the probes saw while the database was down.
#[derive(Default)]
pub struct Probes {
    pub healthz: Vec<u16>,
    pub readyz: Vec<(u16, Duration)>,
    /// A fresh keyed signal each: its first answer and how long it took.
    pub signals: Vec<(String, String, Reply, Duration)>,
}

/// Probes `/healthz`, `/readyz` and a fresh keyed signal, at once, every 250 ms for `time`.
pub async fn probe_for(server: &Server, tenant: &Tenant, time: Duration) -> Probes {
    let started = Instant::now();
    let mut rounds = tokio::task::JoinSet::new();
    let mut n = 0;
    while started.elapsed() < time {
        let (client, base, tenant) = (server.client.clone(), server.base.clone(), tenant.clone());
        rounds.spawn(async move {
            let timed_get = |path: &str| {
                let (client, url) = (client.clone(), format!("{base}{path}"));
                async move {
                    let asked = Instant::now();
                    let status = client.get(url).send().await.unwrap().status().as_u16();
                    (status, asked.elapsed())
                }
            };
            let key = new_key();
            let body = sim_swap(&format!("+447999{n:06}"));
            let signal = async {
                let asked = Instant::now();
                let req = signed(
                    client.post(format!("{base}/v1/signals")),
                    &tenant,
                    Some(&key),
                    &body,
                    super::now(),
                );
                let reply = Reply::from(req.send().await.unwrap()).await;
                (reply, asked.elapsed())
            };
            let ((health, _), ready, (reply, took)) =
                tokio::join!(timed_get("/healthz"), timed_get("/readyz"), signal);
            (health, ready, (key, body, reply, took))
        });
        n += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut probes = Probes::default();
    for (health, ready, signal) in rounds.join_all().await {
        probes.healthz.push(health);
        probes.readyz.push(ready);
        probes.signals.push(signal);
    }
    probes
}

/// How often each status came, in order.
pub fn counts(statuses: impl Iterator<Item = u16>) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for s in statuses {
        *counts.entry(s).or_default() += 1;
    }
    counts
}

/// Sends each probe's signal again (same key and bytes) until it gets a final answer.
pub async fn retry_probe_signals(
    server: &Server,
    tenant: &Tenant,
    probes: &Probes,
    tally: &Tally,
) -> Vec<Sent> {
    let client = super::retrying::client();
    let here = Mutex::new(server.base.clone());
    let mut sent = Vec::new();
    for (key, body, _, _) in &probes.signals {
        let reply = send_until_answered(
            &client,
            &here,
            tenant,
            Some(key),
            body,
            tally,
            SIGNAL_DEADLINE,
        )
        .await;
        sent.push(Sent {
            key: key.clone(),
            body: body.clone(),
            reply,
            answered_at: Instant::now(),
        });
    }
    sent
}

/// While the database could not answer (`fault`, for `down_for`): `/healthz` answered 200,
/// `/readyz` 503 and every signal, probe or sender's, 503 with `Retry-After`, each within
/// [`UNAVAILABLE_WITHIN`], and no answer of any kind took longer.
pub fn check_unavailable(
    scenario: &str,
    fault: &str,
    down_for: Duration,
    senders: usize,
    probes: &Probes,
    tally: &Tally,
) {
    let slowest = |v: &mut dyn Iterator<Item = Duration>| v.max().unwrap_or_default();
    let readyz_slowest = slowest(&mut probes.readyz.iter().map(|(_, t)| *t));
    let signal_slowest = slowest(&mut probes.signals.iter().map(|(_, _, _, t)| *t));
    eprintln!(
        "{scenario}: {fault} {} ms under {senders} senders; {} probes: /healthz {:?}, \
         /readyz {:?} (slowest {} ms), fresh signals {:?} (slowest {} ms)",
        down_for.as_millis(),
        probes.healthz.len(),
        counts(probes.healthz.iter().copied()),
        counts(probes.readyz.iter().map(|(s, _)| *s)),
        readyz_slowest.as_millis(),
        counts(probes.signals.iter().map(|(_, _, r, _)| r.status)),
        signal_slowest.as_millis(),
    );
    // The fault happened and was seen: probes ran while it lasted (each then asserted 503).
    assert!(
        !probes.readyz.is_empty() && !probes.signals.is_empty(),
        "{scenario}: no probe ran while the fault lasted"
    );
    assert!(
        probes.healthz.iter().all(|&s| s == 200),
        "{scenario}: /healthz answers 200 while the fault lasts"
    );
    assert!(
        probes
            .readyz
            .iter()
            .all(|&(s, t)| s == 503 && t <= UNAVAILABLE_WITHIN),
        "{scenario}: /readyz answers 503 within {UNAVAILABLE_WITHIN:?} while the fault lasts: {:?}",
        probes.readyz
    );
    for (key, _, reply, took) in &probes.signals {
        assert_eq!(
            reply.status, 503,
            "{scenario}: signal {key} during the fault"
        );
        assert!(
            reply.header("retry-after").is_some(),
            "{scenario}: a 503 carries Retry-After"
        );
        assert_eq!(
            reply.json()["type"],
            "https://verdict.dev/problems/temporarily-unavailable"
        );
        assert!(
            *took <= UNAVAILABLE_WITHIN,
            "{scenario}: signal {key} took {took:?} to be refused"
        );
    }
    assert_eq!(
        Tally::get(&tally.unavailable_slow),
        0,
        "{scenario}: every 503 the senders got came within {UNAVAILABLE_WITHIN:?}: {}",
        tally.summary()
    );
    assert_eq!(
        Tally::get(&tally.unavailable_without_retry_after),
        0,
        "{scenario}: every 503 carries Retry-After"
    );
    assert_eq!(
        Tally::get(&tally.slow_answers),
        0,
        "{scenario}: no request waited out the fault: {}",
        tally.summary()
    );
}

/// No 409 came later than the lock timeout after the database answered again (`back_at`): no
/// key stayed locked. Says when the last one came.
pub fn check_no_key_locked_after(scenario: &str, tally: &Tally, back_at: Instant) -> String {
    let last_conflict = *tally.last_conflict.lock().unwrap();
    match last_conflict {
        Some(last) if last > back_at => {
            assert!(
                last <= back_at + LOCK_TIMEOUT,
                "{scenario}: a key was still locked {:?} after the database returned (lock timeout {LOCK_TIMEOUT:?})",
                last - back_at
            );
            format!("{} ms after it returned", (last - back_at).as_millis())
        }
        Some(_) => "before it returned".into(),
        None => "never".into(),
    }
}

/// How long after `at` the first final answer came.
pub fn first_answer_after(sent: &[Sent], at: Instant) -> Duration {
    sent.iter()
        .filter(|s| s.answered_at > at)
        .map(|s| s.answered_at - at)
        .min()
        .unwrap_or_default()
}

/// What a failover left, from the senders' side.
pub struct AfterFailover {
    /// Decisions acknowledged (answered) before the primary was killed.
    pub acknowledged_before_kill: usize,
    /// Signals answered after the promotion.
    pub resumed: usize,
    /// How soon after the promotion the first answer came.
    pub first_after: Duration,
}

/// Checks that every decision acknowledged with a 200 is among `on_new_primary` (the event ids
/// the promoted node holds) and that the same server answered after `promoted_at`.
pub fn check_failover(
    scenario: &str,
    sent: &[Sent],
    on_new_primary: &BTreeSet<String>,
    killed_at: Instant,
    promoted_at: Instant,
) -> AfterFailover {
    let lost: Vec<String> = sent
        .iter()
        .filter(|s| s.reply.status == 200)
        .map(|s| s.reply.json()["event_id"].as_str().unwrap().to_owned())
        .filter(|id| !on_new_primary.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{scenario}: acknowledged decisions missing on the promoted node: {lost:?}"
    );
    let resumed = sent.iter().filter(|s| s.answered_at > promoted_at).count();
    assert!(
        resumed > 0,
        "{scenario}: the server resumed on the promoted node without a restart"
    );
    AfterFailover {
        acknowledged_before_kill: sent.iter().filter(|s| s.answered_at < killed_at).count(),
        resumed,
        first_after: first_answer_after(sent, promoted_at),
    }
}
