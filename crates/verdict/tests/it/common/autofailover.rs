//! A `pg_auto_failover` formation of the test's own (Debian's `postgresql-NN-auto-failover`): a
//! monitor and two Postgres nodes made with `pg_autoctl create … --run` on free loopback ports,
//! in one temp directory (`verdict-vfaults-<pid>-<label>`, which `scripts/faults` removes when a
//! killed run left it), with trust authentication and no TLS. The monitor, not the test, decides
//! the failover: the test only kills a node.
//!
//! pg_autoctl runs as `postgres` (through `runuser` when we are root), with its XDG folders
//! inside the temp directory so that nothing lands in the `postgres` user's home. Dropping the
//! value SIGKILLs every process of the formation and removes the directory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::{free_port, kill_tree, pg_version, psql};

/// How long the monitor waits before it calls a node unhealthy and promotes, lowered from
/// pg_auto_failover's defaults (a 5 s health check retried twice, 20 s unhealthy, 30 s for the
/// old primary to demote itself) so the scenario fits CI; each in milliseconds.
const MONITOR_TIMING: [(&str, &str); 6] = [
    ("pgautofailover.health_check_period", "1000"),
    ("pgautofailover.health_check_timeout", "1000"),
    ("pgautofailover.health_check_max_retries", "1"),
    ("pgautofailover.health_check_retry_delay", "500"),
    ("pgautofailover.node_considered_unhealthy_timeout", "3000"),
    ("pgautofailover.primary_demote_timeout", "3000"),
];

/// How long the formation may take to reach a state it was asked for.
const SETTLE_WITHIN: Duration = Duration::from_secs(120);

/// One Postgres node of the formation.
pub struct Node {
    pub name: String,
    pub port: u16,
    supervisor: Child,
}

impl Node {
    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }
}

/// A running monitor and its nodes; `nodes[0]` was the first primary.
pub struct Formation {
    dir: PathBuf,
    pub monitor_port: u16,
    monitor: Child,
    pub nodes: Vec<Node>,
}

impl Formation {
    /// A monitor and two nodes, the first primary and the second its synchronous standby
    /// (pg_auto_failover's default with one standby in the replication quorum:
    /// `synchronous_standby_names = 'ANY 1 (…)'`); returns once both nodes report the state the
    /// monitor assigned them and the standby streams as a quorum member.
    pub fn create(label: &str) -> Formation {
        let dir =
            std::env::temp_dir().join(format!("verdict-vfaults-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        super::cluster::run(&["chown", "postgres", dir.to_str().unwrap()]);
        let monitor_port = free_port();
        let monitor = autoctl(
            &dir,
            "monitor",
            &["create", "monitor", "--pgport", &monitor_port.to_string()],
        );
        let mut formation = Formation {
            dir,
            monitor_port,
            monitor,
            nodes: Vec::new(),
        };
        formation.wait_for("the monitor to accept its nodes", |f| {
            f.try_monitor("SELECT COUNT(*) FROM pgautofailover.formation")
                .is_some()
        });
        for (setting, value) in MONITOR_TIMING {
            formation.monitor_sql(&format!("ALTER SYSTEM SET {setting} = {value}"));
        }
        formation.monitor_sql("SELECT pg_reload_conf()");

        let uri = format!(
            "postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable"
        );
        for (n, settled) in [(1, "single"), (2, "secondary")] {
            let name = format!("node{n}");
            let port = free_port();
            let supervisor = autoctl(
                &formation.dir,
                &name,
                &[
                    "create",
                    "postgres",
                    "--pgport",
                    &port.to_string(),
                    "--name",
                    &name,
                    "--monitor",
                    &uri,
                ],
            );
            formation.nodes.push(Node {
                name: name.clone(),
                port,
                supervisor,
            });
            formation.wait_for(&format!("{name} to be {settled}"), |f| {
                f.state(&name) == Some((settled.to_owned(), settled.to_owned()))
            });
        }
        formation.wait_for("node1 to be primary with a synchronous standby", |f| {
            f.state("node1") == Some(("primary".into(), "primary".into()))
                && psql(
                    f.nodes[0].port,
                    "postgres",
                    "SELECT COUNT(*) FROM pg_stat_replication \
                     WHERE sync_state IN ('sync', 'quorum')",
                ) == "1"
        });
        formation
    }

    /// The primary's `synchronous_standby_names`, as the keeper set it.
    pub fn synchronous_standby_names(&self, node: usize) -> String {
        psql(
            self.nodes[node].port,
            "postgres",
            "SHOW synchronous_standby_names",
        )
    }

    /// The state `name` last reported and the one the monitor assigned it.
    pub fn state(&self, name: &str) -> Option<(String, String)> {
        let row = self.try_monitor(&format!(
            "SELECT reportedstate || ' ' || goalstate FROM pgautofailover.node \
             WHERE nodename = '{name}'"
        ))?;
        let (reported, goal) = row.split_once(' ')?;
        Some((reported.to_owned(), goal.to_owned()))
    }

    /// A node crashes whole: its pg_autoctl supervisor, keeper, postmaster and every backend
    /// SIGKILLed at once, so nothing restarts it. Returns how many processes were killed.
    pub fn kill_node(&mut self, node: usize) -> usize {
        let killed = kill_tree(self.nodes[node].supervisor.id());
        let _ = self.nodes[node].supervisor.wait();
        killed
    }

    /// Waits until the monitor has made `name` the primary (`wait_primary` while its old
    /// standby is gone, `primary` once one is back) and it takes writes.
    pub fn wait_until_primary(&self, node: usize) {
        let name = self.nodes[node].name.clone();
        self.wait_for(&format!("{name} to be promoted"), |f| {
            matches!(f.state(&name), Some((reported, _)) if reported == "wait_primary" || reported == "primary")
                && psql(f.nodes[node].port, "postgres", "SHOW transaction_read_only") == "off"
        });
    }

    /// How many times the monitor decided to promote a secondary (its `prepare_promotion`
    /// assignment to a node that was a secondary, in `pgautofailover.event`).
    pub fn promotions(&self) -> usize {
        self.monitor_sql(
            "SELECT COUNT(*) FROM pgautofailover.event \
             WHERE reportedstate = 'secondary' AND goalstate = 'prepare_promotion'",
        )
        .parse()
        .unwrap()
    }

    /// The monitor's event log, oldest first, for a failure's message.
    pub fn events(&self) -> String {
        self.try_monitor(
            "SELECT string_agg(eventtime::time || ' ' || nodename || ' ' || reportedstate || \
             ' -> ' || goalstate, E'\\n' ORDER BY eventid) FROM pgautofailover.event",
        )
        .unwrap_or_default()
    }

    fn monitor_sql(&self, sql: &str) -> String {
        psql(self.monitor_port, "pg_auto_failover", sql)
    }

    fn try_monitor(&self, sql: &str) -> Option<String> {
        super::cluster::try_psql(self.monitor_port, "pg_auto_failover", sql)
    }

    fn wait_for(&self, what: &str, done: impl Fn(&Formation) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(
                started.elapsed() < SETTLE_WITHIN,
                "pg_auto_failover: waited {SETTLE_WITHIN:?} for {what}; the monitor's events:\n{}\n\
                 logs in {}",
                self.events(),
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Formation {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            kill_tree(node.supervisor.id());
            let _ = node.supervisor.wait();
        }
        kill_tree(self.monitor.id());
        let _ = self.monitor.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Starts `pg_autoctl ARGS --pgdata DIR/NAME --hostname 127.0.0.1 --auth trust --no-ssl --run`
/// as `postgres`, its output in `DIR/NAME.log`.
fn autoctl(dir: &std::path::Path, name: &str, args: &[&str]) -> Child {
    let version = pg_version();
    let bin = format!("/usr/lib/postgresql/{version}/bin");
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let pgdata = dir.join(name);
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut cmd = if root {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--", "env"]);
        cmd
    } else {
        Command::new("env")
    };
    cmd.arg(format!("XDG_CONFIG_HOME={}", dir.join("config").display()))
        .arg(format!("XDG_DATA_HOME={}", dir.join("data").display()))
        .arg(format!("XDG_RUNTIME_DIR={}", dir.join("run").display()))
        .arg(format!("PG_CONFIG={bin}/pg_config"))
        .arg(format!(
            "PATH={bin}:{}",
            std::env::var("PATH").unwrap_or_default()
        ))
        .arg("pg_autoctl")
        .args(args)
        .args(["--pgdata", pgdata.to_str().unwrap()])
        .args(["--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl"])
        .arg("--run")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    cmd.spawn().unwrap_or_else(|e| {
        panic!("pg_autoctl could not start (postgresql-{version}-auto-failover is needed): {e}")
    })
}
