//! The fault suite's crashes across instances (issue 28 item 4): three `verdict serve`
//! processes (no worker inside) and two `verdict worker` processes on one PostgreSQL database,
//! behind HAProxy, while random ones of the five are SIGKILLed and restarted. Senders send each
//! signal through the balancer and a duplicate of it straight to a random instance, so copies
//! of one key race on different processes while those processes die. Afterwards the end-of-run
//! checks of every scenario hold: one event, one set of effects and one callback per signal.
//!
//! Runs under `scripts/faults` (`VERDICT_FAULTS=short|long`; a plain `cargo test` skips it),
//! which installs HAProxy when it is missing.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::receiver::{Receiver, Step};
use crate::common::retrying::{Tally, client, send_until_answered};
use crate::common::scenario::{
    KeepLog, SIGNAL_DEADLINE, Sent, Size, check_callbacks, check_exactly_once,
};
use crate::common::{Backend, Server, Tenant, TestDb, new_key, random_between, sim_swap};

/// How every process runs: callbacks to this machine, retries a second apart, a 3 s lock (a
/// retry takes a dead holder's key over soon), and the per-client connection cap raised, since
/// behind HAProxy every connection comes from one address.
const ENV: [(&str, &str); 5] = [
    ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
    ("VERDICT_RETRY_INTERVAL_SECS", "1"),
    ("VERDICT_LOCK_TIMEOUT_SECS", "3"),
    ("VERDICT_MAX_CONNECTIONS_PER_CLIENT", "4096"),
    ("VERDICT_RATE_LIMIT_PER_TENANT", "0"),
];

/// A free loopback port (bound and let go: a process started next binds it).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where this scenario's processes write their logs.
fn log_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("VERDICT_FAULTS_LOG_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("instances");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One of the five processes, restartable in place (an instance on the same port).
enum Process {
    Instance { port: u16, server: Option<Server> },
    Worker { n: usize, child: Option<Child> },
}

impl Process {
    fn start(&mut self, db: &TestDb) {
        match self {
            Process::Instance { port, server } => {
                let listen = format!("127.0.0.1:{port}");
                *server = Some(Server::start_with(
                    db,
                    &["serve", "--listen", &listen, "--no-worker"],
                    &ENV,
                ));
            }
            Process::Worker { n, child } => {
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(log_dir().join(format!("worker-{n}.log")))
                    .unwrap();
                let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
                cmd.arg("worker")
                    .env("VERDICT_DATABASE_URL", &db.url)
                    .env("VERDICT_MASTER_KEY", &db.master_key)
                    .env("VERDICT_LOG_FORMAT", "json")
                    .env_remove("FAILPOINTS")
                    .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
                    .stdout(Stdio::null())
                    .stderr(log);
                cmd.envs(ENV);
                *child = Some(cmd.spawn().unwrap());
            }
        }
    }

    /// SIGKILLs it (a `Child::kill` is SIGKILL) and reaps it.
    fn kill(&mut self) {
        match self {
            Process::Instance { server, .. } => {
                if let Some(server) = server.take() {
                    server.kill();
                }
            }
            Process::Worker { child, .. } => {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
    }

    fn is_instance(&self) -> bool {
        matches!(self, Process::Instance { .. })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// HAProxy in front of the instances, round robin, health-checked on `/readyz` every 200 ms, a
/// connection refused by a dead instance tried on another; killed on drop.
struct Balancer {
    base: String,
    child: Child,
}

impl Balancer {
    fn start(ports: &[u16]) -> Balancer {
        let port = free_port();
        let mut config = format!(
            "global\n    maxconn 4096\ndefaults\n    mode http\n    timeout connect 1s\n    \
             timeout client 60s\n    timeout server 60s\n    retries 3\n    option redispatch\n\
             frontend verdict\n    bind 127.0.0.1:{port}\n    default_backend instances\n\
             backend instances\n    balance roundrobin\n    option httpchk GET /readyz\n"
        );
        for (i, p) in ports.iter().enumerate() {
            config.push_str(&format!(
                "    server verdict{i} 127.0.0.1:{p} check inter 200ms fall 1 rise 1\n"
            ));
        }
        let path = log_dir().join("haproxy.cfg");
        std::fs::write(&path, config).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy is missing: scripts/faults installs Debian's package");
        Balancer {
            base: format!("http://127.0.0.1:{port}"),
            child,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the killer did.
#[derive(Default)]
struct Kills {
    instances: AtomicUsize,
    workers: AtomicUsize,
}

impl Kills {
    /// A kind no kill has reached yet (`true` for instances, `false` for workers), if any:
    /// instances first.
    fn unkilled_kind(&self) -> Option<bool> {
        if self.instances.load(Ordering::Relaxed) == 0 {
            Some(true)
        } else if self.workers.load(Ordering::Relaxed) == 0 {
            Some(false)
        } else {
            None
        }
    }
}

/// A random one of `processes`; for the `last` planned kill, one of a kind not killed yet, so
/// that both kinds always are (eight kills drawn from five processes left the two workers
/// alone about once in sixty runs).
fn pick_victim(processes: &[Process], kills: &Kills, last: bool) -> usize {
    let candidates: Vec<usize> = (0..processes.len())
        .filter(|&i| match kills.unkilled_kind().filter(|_| last) {
            Some(instance) => processes[i].is_instance() == instance,
            None => true,
        })
        .collect();
    candidates[random_between(0, candidates.len() as u64 - 1) as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crashes_across_instances_and_workers_keep_every_signal_exactly_once() {
    let Some(size) = Size::from_env("crashes across instances") else {
        return;
    };
    let db = Arc::new(TestDb::new(Backend::Postgres).await);
    // Every other callback of the first ones is refused, so the workers have retries to make
    // while they are killed.
    let receiver = Receiver::start(
        (0..40)
            .map(|i| Step::status(if i % 2 == 0 { 503 } else { 204 }))
            .collect(),
    )
    .await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);

    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut processes: Vec<Process> = ports
        .iter()
        .map(|&port| Process::Instance { port, server: None })
        .chain((0..2).map(|n| Process::Worker { n, child: None }))
        .collect();
    for p in &mut processes {
        p.start(&db);
    }
    let balancer = Balancer::start(&ports);
    let instance_urls: Vec<String> = ports
        .iter()
        .map(|p| format!("http://127.0.0.1:{p}"))
        .collect();
    wait_until_balanced(&balancer.base).await;

    let (senders, storm_for, planned_kills) = size.pick(
        (6, Duration::from_secs(12), 8),
        (16, Duration::from_secs(60), 40),
    );
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let duplicates_on_other_instances = Arc::new(AtomicUsize::new(0));
    let sending: Vec<_> = (0..senders)
        .map(|s| {
            let (tenant, tally, stop, balancer, instances, dups) = (
                tenant.clone(),
                tally.clone(),
                stop.clone(),
                balancer.base.clone(),
                instance_urls.clone(),
                duplicates_on_other_instances.clone(),
            );
            tokio::spawn(send_with_duplicates(
                s, tenant, tally, stop, balancer, instances, dups,
            ))
        })
        .collect();

    // The killer: a random one of the five every 0.3–1.5 s, restarted 0.2–1 s later.
    let kills = Kills::default();
    let started = Instant::now();
    let mut done = 0;
    while started.elapsed() < storm_for || done < planned_kills {
        tokio::time::sleep(Duration::from_millis(random_between(
            300,
            storm_for.as_millis() as u64 * 2 / planned_kills as u64,
        )))
        .await;
        let victim = pick_victim(&processes, &kills, done + 1 >= planned_kills);
        let p = &mut processes[victim];
        let was_instance = p.is_instance();
        // Killing an instance waits for the process to exit, so off the runtime's threads.
        tokio::task::block_in_place(|| p.kill());
        if was_instance {
            kills.instances.fetch_add(1, Ordering::Relaxed);
        } else {
            kills.workers.fetch_add(1, Ordering::Relaxed);
        }
        done += 1;
        tokio::time::sleep(Duration::from_millis(random_between(200, 1000))).await;
        tokio::task::block_in_place(|| p.start(&db));
    }
    stop.store(true, Ordering::SeqCst);
    let mut sent = Vec::new();
    for s in sending {
        sent.extend(s.await.unwrap());
    }

    let scenario = "crashes across instances";
    let checker = processes
        .iter()
        .find_map(|p| match p {
            Process::Instance {
                server: Some(s), ..
            } => Some(s),
            _ => None,
        })
        .unwrap();
    let _keep = KeepLog(checker, "instances-checker");
    let (event_ids, duplicates_after) =
        check_exactly_once(scenario, &db, checker, &tenant, &sent).await;
    let attempts = check_callbacks(scenario, &db, &receiver, &event_ids).await;
    let (instance_kills, worker_kills) = (
        kills.instances.load(Ordering::Relaxed),
        kills.workers.load(Ordering::Relaxed),
    );
    let dups = duplicates_on_other_instances.load(Ordering::Relaxed);
    let retries = tally.retries(sent.len() * 2);
    eprintln!(
        "{scenario}: {} signals through HAProxy to 3 instances and 2 workers, {} kills (faults \
         injected: {instance_kills} of instances, {worker_kills} of workers, each restarted); \
         {dups} duplicates sent straight to an instance while the original went through the \
         balancer, {retries} retries with the same key and bytes, {duplicates_after} duplicates \
         sent after the storm = {} duplicates absorbed; {}; {} callbacks ({attempts} attempts)",
        sent.len(),
        instance_kills + worker_kills,
        dups + retries + duplicates_after,
        tally.summary(),
        event_ids.len(),
    );
    assert!(
        instance_kills + worker_kills >= planned_kills,
        "{scenario}: {} kills, {planned_kills} planned",
        instance_kills + worker_kills
    );
    assert!(
        instance_kills > 0 && worker_kills > 0,
        "{scenario}: both kinds of process were killed"
    );
    assert_eq!(
        dups,
        sent.len(),
        "{scenario}: every signal had a duplicate on an instance"
    );
    drop(balancer);
}

/// Waits until the balancer has found an instance up.
async fn wait_until_balanced(base: &str) {
    let client = client();
    for _ in 0..150 {
        if let Ok(r) = client.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("HAProxy never found a ready instance");
}

/// One sender: fresh keyed SIM swaps one after another until stopped, each sent through the
/// balancer and, at once, as a duplicate straight to a random instance, both until they get a
/// final answer; the two answers must be the same record.
async fn send_with_duplicates(
    s: usize,
    tenant: Tenant,
    tally: Arc<Tally>,
    stop: Arc<AtomicBool>,
    balancer: String,
    instances: Vec<String>,
    duplicates: Arc<AtomicUsize>,
) -> Vec<Sent> {
    let client = client();
    let through = Mutex::new(balancer);
    let mut sent = Vec::new();
    for n in 0.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let key = new_key();
        let body = sim_swap(&format!("+448{s:03}{n:06}"));
        let direct =
            Mutex::new(instances[random_between(0, instances.len() as u64 - 1) as usize].clone());
        let (reply, copy) = tokio::join!(
            send_until_answered(
                &client,
                &through,
                &tenant,
                Some(&key),
                &body,
                &tally,
                SIGNAL_DEADLINE
            ),
            send_until_answered(
                &client,
                &direct,
                &tenant,
                Some(&key),
                &body,
                &tally,
                SIGNAL_DEADLINE
            ),
        );
        duplicates.fetch_add(1, Ordering::Relaxed);
        assert_eq!(
            (copy.status, copy.json()),
            (reply.status, reply.json()),
            "{key}: the duplicate on another instance got another answer"
        );
        sent.push(Sent {
            key,
            body,
            reply,
            answered_at: Instant::now(),
        });
    }
    sent
}
