//! A PgBouncer of the test's own (Debian's `pgbouncer` package) in front of one PostgreSQL
//! server, on a free loopback port, with its configuration, log and pid file in a temp directory
//! (`verdict-vfaults-<pid>-<label>`, which `scripts/faults` removes when a killed run left it).
//! It runs as `postgres` (PgBouncer refuses to run as root); dropping the value stops it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::{free_port, kill_tree, run};

/// PgBouncer's `pool_mode`.
#[derive(Clone, Copy, Debug)]
pub enum PoolMode {
    Session,
    Transaction,
}

pub struct PgBouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

impl PgBouncer {
    /// PgBouncer on a free port forwarding every database to the server on 127.0.0.1:`server`,
    /// at most `pool_size` server connections per database and user (`default_pool_size`, and
    /// no reserve pool), clients authenticated by trust.
    pub fn start(label: &str, server: u16, mode: PoolMode, pool_size: u32) -> PgBouncer {
        let dir =
            std::env::temp_dir().join(format!("verdict-vfaults-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let d = dir.display();
        // `extra_float_digits` is in every sqlx startup packet; PgBouncer 1.18 refuses startup
        // parameters it does not track unless told to ignore them.
        let ini = format!(
            "[databases]\n\
             * = host=127.0.0.1 port={server}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {d}/users.txt\n\
             admin_users = postgres\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 1000\n\
             ignore_startup_parameters = extra_float_digits\n\
             logfile = {d}/pgbouncer.log\n\
             pidfile = {d}/pgbouncer.pid\n"
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        run(&["chown", "-R", "postgres", dir.to_str().unwrap()]);
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        let mut cmd = if root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--", "pgbouncer"]);
            cmd
        } else {
            Command::new("pgbouncer")
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("pgbouncer could not start (Debian's pgbouncer is needed): {e}")
            });
        let bouncer = PgBouncer { port, dir, child };
        let started = Instant::now();
        while bouncer.try_admin("SHOW VERSION").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "pgbouncer did not start; its log:\n{}",
                bouncer.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bouncer
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`, through the pooler.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Client connections to `database`: (active or idle, waiting for a server connection),
    /// from the admin console's `SHOW POOLS`.
    pub fn clients(&self, database: &str) -> (u32, u32) {
        let Some(pools) = self.try_admin("SHOW POOLS") else {
            return (0, 0);
        };
        // database|user|cl_active|cl_waiting|...
        pools
            .lines()
            .map(|l| l.split('|').collect::<Vec<_>>())
            .filter(|f| f.first() == Some(&database))
            .fold((0, 0), |(a, w), f| {
                let n = |i: usize| f.get(i).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
                (a + n(2), w + n(3))
            })
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn try_admin(&self, command: &str) -> Option<String> {
        super::cluster::try_psql(self.port, "pgbouncer", command)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        kill_tree(self.child.id());
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
