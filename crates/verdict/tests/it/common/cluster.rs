//! PostgreSQL clusters of a scenario's own, made with Debian's `pg_createcluster` on free
//! loopback ports, for the fault scenarios that stop, kill or promote a database: never the
//! machine's shared server, which other tests are using. Each cluster is dropped with
//! `pg_dropcluster --stop` when its value is dropped.
//!
//! Needs root (the commands then run as `postgres` where PostgreSQL wants its own user) or the
//! `postgres` user itself. Names are `vfaults-<pid>-<label>`, so `scripts/faults` can drop the
//! clusters of a run that was killed before it could.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A running cluster of our own.
pub struct Cluster {
    pub name: String,
    pub port: u16,
    version: String,
    data: PathBuf,
}

impl Cluster {
    /// Creates and starts a cluster with trust authentication on a free loopback port.
    pub fn create(label: &str) -> Cluster {
        let cluster = Cluster::new_stopped(label);
        cluster.start();
        cluster
    }

    /// Creates a streaming-replication standby of `primary` (`pg_basebackup -R`) and starts it.
    /// The primary waits for it on commit once [`Cluster::make_standby_synchronous`] is called.
    pub fn standby_of(primary: &Cluster, label: &str) -> Cluster {
        let standby = Cluster::new_stopped(label);
        std::fs::remove_dir_all(&standby.data).expect("emptying the standby's data directory");
        as_postgres(&[
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            &primary.port.to_string(),
            "-U",
            "postgres",
            "-D",
            standby.data.to_str().unwrap(),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        ]);
        standby.start();
        standby
    }

    /// Creates and starts a cluster whose data directory is `data` (its parent writable by
    /// `postgres`) and whose write-ahead log is in a folder of the system's temp directory, as
    /// a deployment keeps the WAL on a volume of its own.
    pub fn create_with_data_in(label: &str, data: PathBuf) -> Cluster {
        let wal = std::env::temp_dir().join(format!(
            "verdict-vfaults-{}-{label}-wal",
            std::process::id()
        ));
        let cluster = Cluster::stopped_at(label, data, &[&format!("--waldir={}", wal.display())]);
        cluster.start();
        cluster
    }

    fn new_stopped(label: &str) -> Cluster {
        let name = format!("vfaults-{}-{label}", std::process::id());
        let data = std::env::temp_dir().join(format!("verdict-{name}"));
        Cluster::stopped_at(label, data, &[])
    }

    /// `pg_createcluster` with its data in `data` and `initdb_options` after trust auth.
    fn stopped_at(label: &str, data: PathBuf, initdb_options: &[&str]) -> Cluster {
        let version = pg_version();
        let name = format!("vfaults-{}-{label}", std::process::id());
        let port = free_port();
        let port_text = port.to_string();
        let mut args = vec![
            "pg_createcluster",
            &version,
            &name,
            "-p",
            &port_text,
            "-d",
            data.to_str().unwrap(),
            "--start-conf",
            "manual",
            "--",
            "--auth=trust",
        ];
        args.extend_from_slice(initdb_options);
        run(&args);
        Cluster {
            name,
            port,
            version,
            data,
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts the cluster and waits until it accepts connections.
    pub fn start(&self) {
        self.ctl(&["start"]);
        self.wait_until_accepting();
    }

    /// A clean, fast shutdown (`pg_ctl stop -m fast`): sessions are ended, nothing is lost.
    pub fn stop(&self) {
        self.ctl(&["stop", "-m", "fast"]);
    }

    /// A crash: SIGKILL to the postmaster and every process it started, at once.
    pub fn kill(&self) {
        let pid_file = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .expect("the cluster is running");
        let postmaster = pid_file.lines().next().unwrap().trim().to_owned();
        let children = run(&["ps", "-o", "pid=", "--ppid", &postmaster]);
        let mut pids = vec![postmaster];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        let mut kill = Command::new("kill");
        kill.arg("-KILL").args(&pids);
        let _ = kill.status();
    }

    /// Promotes a standby to primary and waits until it accepts writes.
    pub fn promote(&self) {
        self.ctl(&["promote"]);
    }

    /// Makes the primary wait for a standby's flush before acknowledging any commit.
    pub fn make_standby_synchronous(&self) {
        run(&[
            "pg_conftool",
            &self.version,
            &self.name,
            "set",
            "synchronous_standby_names",
            "*",
        ]);
        self.ctl(&["reload"]);
    }

    /// Runs one SQL statement with `psql` and returns its unaligned output.
    pub fn psql(&self, database: &str, sql: &str) -> String {
        psql(self.port, database, sql)
    }

    /// Waits until a synchronous standby is streaming from this primary.
    pub fn wait_for_synchronous_standby(&self) {
        let started = Instant::now();
        while self.psql(
            "postgres",
            "SELECT COUNT(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        ) != "1"
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the standby of {} never became synchronous",
                self.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_until_accepting(&self) {
        let started = Instant::now();
        loop {
            let ready = Command::new("pg_isready")
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "cluster {} did not start",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ctl(&self, args: &[&str]) {
        let mut all = vec![
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            &self.version,
            &self.name,
        ];
        all.extend_from_slice(args);
        run(&all);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A WAL of its own (`create_with_data_in`) is a folder the data directory links to.
        let wal = std::fs::read_link(self.data.join("pg_wal")).ok();
        let _ = Command::new("pg_dropcluster")
            .args(["--stop", &self.version, &self.name])
            .output();
        let _ = std::fs::remove_dir_all(&self.data);
        if let Some(wal) = wal {
            let _ = std::fs::remove_dir_all(wal);
        }
    }
}

/// Runs one SQL statement with `psql` as `postgres` on 127.0.0.1:`port`; its trimmed output,
/// or `None` when it fails (the server not up yet, say): for polling.
pub fn try_psql(port: u16, database: &str, sql: &str) -> Option<String> {
    let out = Command::new("psql")
        .args(["-X", "-qAt", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-U", "postgres", "-d", database, "-c", sql])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Runs one SQL statement with `psql` as `postgres` on 127.0.0.1:`port` and returns its
/// unaligned output, failing the test if it fails.
pub fn psql(port: u16, database: &str, sql: &str) -> String {
    let out = run(&[
        "psql",
        "-X",
        "-qAt",
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "postgres",
        "-d",
        database,
        "-c",
        sql,
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The PostgreSQL major version Debian's packages installed (the one folder of `/etc/postgresql`).
pub fn pg_version() -> String {
    std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut dir| dir.next())
        .and_then(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .expect(
            "Debian's PostgreSQL packages (postgresql-common) are needed: /etc/postgresql is empty",
        )
}

/// SIGKILLs `pid` and every process descended from it, all at once (so a supervisor cannot
/// restart what it watches); returns how many processes were signalled.
pub fn kill_tree(pid: u32) -> usize {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces, so read after the last ')'.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parents.push((child, ppid));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    let mut kill = Command::new("kill");
    kill.arg("-KILL").args(tree.iter().map(u32::to_string));
    let _ = kill.output();
    tree.len()
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Runs a command, failing the test loudly with its output if it fails.
pub fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{} could not run: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a command as `postgres` (through `runuser` when we are root), for the tools that must
/// own what they write.
pub fn as_postgres(args: &[&str]) -> Output {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if root {
        let mut all = vec!["runuser", "-u", "postgres", "--"];
        all.extend_from_slice(args);
        run(&all)
    } else {
        run(args)
    }
}
