//! The one test harness: a fresh database per test on either backend, the real `verdict` binary
//! on a real socket, tenants made with the real CLI, and signed requests.

pub mod autofailover;
pub mod cluster;
pub mod collector;
pub mod console;
pub mod deliveries;
pub mod effects;
pub mod fault_proxy;
pub mod hostile;
pub mod pgbouncer;
pub mod proxy;
pub mod receiver;
pub mod retrying;
pub mod scenario;
pub mod sets;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;
use sqlx::{PgPool, SqlitePool};
use uuid::Uuid;

/// Which database a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Runs each named `async fn name(backend: Backend)` in this file once per backend, as
/// `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}

/// The PostgreSQL server tests create their databases on.
pub fn pg_admin_url() -> String {
    std::env::var("VERDICT_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of its own for one test, dropped afterwards.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pub master_key: String,
    dir: PathBuf,
    pg_name: Option<String>,
}

impl TestDb {
    /// A fresh, empty database on `backend`.
    pub async fn new(backend: Backend) -> TestDb {
        let dir = std::env::temp_dir().join(format!("verdict-test-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let master_key = base64::engine::general_purpose::STANDARD.encode(rand_bytes());
        match backend {
            Backend::Sqlite => TestDb {
                backend,
                url: format!("sqlite://{}", dir.join("verdict.db").display()),
                master_key,
                dir,
                pg_name: None,
            },
            Backend::Postgres => {
                let name = format!("verdict_test_{}", Uuid::new_v4().simple());
                let url = create_database(&pg_admin_url(), &name).await;
                TestDb {
                    backend,
                    url,
                    master_key,
                    dir,
                    pg_name: Some(name),
                }
            }
        }
    }

    /// A fresh SQLite database in `dir` (which the test made, e.g. a small filesystem).
    pub fn sqlite_in(dir: std::path::PathBuf) -> TestDb {
        TestDb {
            backend: Backend::Sqlite,
            url: format!("sqlite://{}", dir.join("verdict.db").display()),
            master_key: base64::engine::general_purpose::STANDARD.encode(rand_bytes()),
            dir,
            pg_name: None,
        }
    }

    /// A fresh database in a cluster of the test's own; it goes when the cluster is dropped.
    pub async fn in_cluster(cluster: &cluster::Cluster) -> TestDb {
        TestDb::in_server(&cluster.admin_url()).await
    }

    /// A fresh database on the PostgreSQL server `admin_url` reaches (its `postgres` database);
    /// it goes with that server.
    pub async fn in_server(admin_url: &str) -> TestDb {
        let mut db = TestDb::new(Backend::Sqlite).await;
        let name = format!("verdict_test_{}", Uuid::new_v4().simple());
        db.backend = Backend::Postgres;
        db.url = create_database(admin_url, &name).await;
        db
    }

    /// The folder for this test's files (SQLite database, key files).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Runs a scalar query (written to work on both backends) against the test database.
    pub async fn scalar(&self, sql: &'static str) -> i64 {
        match self.backend {
            Backend::Sqlite => {
                let pool = SqlitePool::connect(&self.url).await.unwrap();
                let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
                pool.close().await;
                n
            }
            Backend::Postgres => {
                let pool = PgPool::connect(&self.url).await.unwrap();
                let n: i64 = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
                pool.close().await;
                n
            }
        }
    }

    /// A text scalar query.
    pub async fn text(&self, sql: &'static str) -> String {
        match self.backend {
            Backend::Sqlite => {
                let pool = SqlitePool::connect(&self.url).await.unwrap();
                let s: String = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
                pool.close().await;
                s
            }
            Backend::Postgres => {
                let pool = PgPool::connect(&self.url).await.unwrap();
                let s: String = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
                pool.close().await;
                s
            }
        }
    }

    /// Rows in a table.
    pub async fn count(&self, table: &str) -> i64 {
        let sql: &'static str = match table {
            "events" => "SELECT COUNT(*) FROM events",
            "idempotency_keys" => "SELECT COUNT(*) FROM idempotency_keys",
            "tenants" => "SELECT COUNT(*) FROM tenants",
            // A subject's lock and deny are one row of `subjects`, each a pair of columns.
            "account_locks" => "SELECT COUNT(*) FROM subjects WHERE locked_by IS NOT NULL",
            "cases" => "SELECT COUNT(*) FROM cases",
            "case_events" => "SELECT COUNT(*) FROM case_events",
            "alert_windows" => "SELECT COUNT(*) FROM alert_windows",
            "ledger_entries" => "SELECT COUNT(*) FROM ledger_entries",
            "denies" => "SELECT COUNT(*) FROM subjects WHERE denied_by IS NOT NULL",
            "deliveries" => "SELECT COUNT(*) FROM deliveries",
            // Every attempt: the rows, and the inline ones recorded on their deliveries.
            "delivery_attempts" => {
                "SELECT (SELECT COUNT(*) FROM delivery_attempts) \
                 + (SELECT COUNT(*) FROM deliveries WHERE inline_attempted_at IS NOT NULL)"
            }
            "playbooks" => "SELECT COUNT(*) FROM playbooks",
            "endpoints" => "SELECT COUNT(*) FROM endpoints",
            other => panic!("no count query for {other}"),
        };
        self.scalar(sql).await
    }

    /// Every byte the database holds: the SQLite files, or a `pg_dump` of the database.
    pub fn dump(&self) -> Vec<u8> {
        match self.backend {
            Backend::Sqlite => {
                let mut bytes = Vec::new();
                for entry in std::fs::read_dir(&self.dir).unwrap() {
                    let path = entry.unwrap().path();
                    let name = path.file_name().unwrap().to_string_lossy().into_owned();
                    if name.starts_with("verdict.db") && !name.ends_with(".master-key") {
                        bytes.extend(std::fs::read(&path).unwrap());
                    }
                }
                assert!(
                    !bytes.is_empty(),
                    "the SQLite database files were not found"
                );
                bytes
            }
            Backend::Postgres => {
                let out = Command::new("pg_dump")
                    .arg(&self.url)
                    .output()
                    .expect("pg_dump must be installed for the postgres dump test");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                out.stdout
            }
        }
    }

    /// Runs the `verdict` CLI against this database and returns its stdout. Callback URLs on
    /// this machine are allowed, as tests' receivers listen on 127.0.0.1.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = self.cli_output(args, &[]);
        assert!(
            out.status.success(),
            "verdict {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Sets the tenant's HTTP connector `name` to `url` with the real CLI; returns what it
    /// printed (`--json`: the connector, with its new signing secret).
    pub fn set_http_connector(&self, tenant: &Tenant, name: &str, url: &str) -> serde_json::Value {
        let out = self.cli(&[
            "connector",
            "set",
            "--tenant",
            &tenant.id,
            "--json",
            "--name",
            name,
            "--kind",
            "http",
            "--url",
            url,
        ]);
        serde_json::from_str(&out).unwrap()
    }

    /// Runs the `verdict` CLI with `stdin` as its standard input and returns its stdout.
    pub fn cli_with_stdin(&self, args: &[&str], stdin: &str) -> String {
        use std::io::Write as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_verdict"))
            .args(args)
            .env("VERDICT_DATABASE_URL", &self.url)
            .env("VERDICT_MASTER_KEY", &self.master_key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "verdict {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs the `verdict` CLI with extra environment (which may override the default
    /// `VERDICT_ALLOW_PRIVATE_DESTINATIONS=1`) and returns its output, failed or not.
    pub fn cli_output(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
        cmd.args(args)
            .env("VERDICT_DATABASE_URL", &self.url)
            .env("VERDICT_MASTER_KEY", &self.master_key)
            .env("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// Ends the leases of the deliveries `condition` picks now, as their running out would:
    /// the worker's next round queues those still pending. Returns how many.
    pub async fn end_leases(&self, condition: &str) -> u64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        self.exec(format!(
            "UPDATE deliveries SET leased_until = {now} WHERE {condition}"
        ))
        .await
    }

    /// Runs a statement (written to work on both backends) against the test database; returns
    /// the rows it affected.
    pub async fn exec(&self, sql: impl Into<String>) -> u64 {
        self.try_exec(sql).await.unwrap()
    }

    /// [`Self::exec`], for a statement the database may refuse: its error.
    pub async fn try_exec(&self, sql: impl Into<String>) -> Result<u64, sqlx::Error> {
        let sql = sqlx::AssertSqlSafe(sql.into());
        match self.backend {
            Backend::Sqlite => {
                let pool = SqlitePool::connect(&self.url).await?;
                let done = sqlx::query(sql).execute(&pool).await;
                pool.close().await;
                Ok(done?.rows_affected())
            }
            Backend::Postgres => {
                let pool = PgPool::connect(&self.url).await?;
                let done = sqlx::query(sql).execute(&pool).await;
                pool.close().await;
                Ok(done?.rows_affected())
            }
        }
    }

    /// `id` as this backend's SQL literal for a UUID column (a BLOB on SQLite): for rows
    /// written as an older version stored them.
    pub fn uuid_sql(&self, id: Uuid) -> String {
        match self.backend {
            Backend::Sqlite => format!("x'{}'", id.simple()),
            Backend::Postgres => format!("'{id}'"),
        }
    }

    /// `id`'s 16 bytes as this backend's SQL literal for a byte-string column.
    pub fn bytes_sql(&self, id: Uuid) -> String {
        match self.backend {
            Backend::Sqlite => format!("x'{}'", id.simple()),
            Backend::Postgres => format!("'\\x{}'::bytea", id.simple()),
        }
    }

    /// Makes `source` (TOML) the tenant's playbook with the real CLI.
    pub fn set_playbook(&self, tenant: &Tenant, source: &str) -> String {
        let path = self.dir.join(format!("playbook-{}.toml", Uuid::new_v4()));
        std::fs::write(&path, source).unwrap();
        self.cli(&[
            "playbook",
            "set",
            "--tenant",
            &tenant.id,
            path.to_str().unwrap(),
        ])
    }

    /// Runs one delivery-worker round with the real binary; returns its JSON report.
    pub fn worker_once(&self, env: &[(&str, &str)]) -> Value {
        let out = self.worker_once_command(env).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The `verdict worker --once` command, to spawn several at once.
    pub fn worker_once_command(&self, env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
        cmd.args(["worker", "--once"])
            .env("VERDICT_DATABASE_URL", &self.url)
            .env("VERDICT_MASTER_KEY", &self.master_key)
            .env("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Creates a tenant with the real CLI.
    pub fn tenant(&self, extra: &[&str]) -> Tenant {
        let mut args = vec!["tenant", "create", "--name", "test", "--json"];
        args.extend_from_slice(extra);
        let json: Value = serde_json::from_str(&self.cli(&args)).unwrap();
        Tenant {
            id: json["tenant_id"].as_str().unwrap().to_owned(),
            api_key: json["api_key"].as_str().unwrap().to_owned(),
            signing_secret: json["signing_secret"].as_str().unwrap().to_owned(),
            webhook_secret: json["webhook_secret"].as_str().unwrap().to_owned(),
        }
    }
}

impl TestDb {
    /// Issues the tenant another API key of `scope` with the real CLI; returns the key's id and
    /// the tenant's credentials with that key in place of its admin key.
    /// An `ingest` key made for one feed alone (`camara` or `set`), as the tenant with it.
    pub fn feed_key(&self, tenant: &Tenant, feed: &str) -> Tenant {
        let out = self.cli(&[
            "tenant", "key", "create", "--tenant", &tenant.id, "--scope", "ingest", "--feed", feed,
            "--json",
        ]);
        let json: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(json["feed"], feed);
        Tenant {
            api_key: json["api_key"].as_str().unwrap().to_owned(),
            ..tenant.clone()
        }
    }

    pub fn issue_key(&self, tenant: &Tenant, scope: &str) -> (String, Tenant) {
        let out = self.cli(&[
            "tenant", "key", "create", "--tenant", &tenant.id, "--scope", scope, "--json",
        ]);
        let json: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(json["scope"], scope);
        let keyed = Tenant {
            api_key: json["api_key"].as_str().unwrap().to_owned(),
            ..tenant.clone()
        };
        (json["key_id"].as_str().unwrap().to_owned(), keyed)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(name) = self.pg_name.take() {
            // Drop runs outside any runtime guarantee, so use a short-lived one on a thread.
            let admin_url = pg_admin_url();
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    if let Ok(admin) = PgPool::connect(&admin_url).await {
                        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                        )))
                        .execute(&admin)
                        .await;
                        admin.close().await;
                    }
                });
            })
            .join();
        }
    }
}

/// Creates database `name` on the server `admin_url` names; returns the database's URL.
async fn create_database(admin_url: &str, name: &str) -> String {
    let admin = PgPool::connect(admin_url).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL is required for the postgres tests and is unreachable at {admin_url} \
             ({e}); start it with `pg_ctlcluster --skip-systemctl-redirect \
             $(ls /etc/postgresql) main start`"
        )
    });
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    format!("{}/{name}", &admin_url[..admin_url.rfind('/').unwrap()])
}

fn rand_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    for chunk in b.chunks_mut(16) {
        chunk.copy_from_slice(Uuid::new_v4().as_bytes());
    }
    b
}

/// A tenant's credentials as `tenant create` printed them.
#[derive(Clone, Debug)]
pub struct Tenant {
    pub id: String,
    pub api_key: String,
    pub signing_secret: String,
    pub webhook_secret: String,
}

/// A running `verdict serve`, killed on drop; its stderr (JSON logs) is kept for inspection.
pub struct Server {
    pub base: String,
    child: Child,
    logs: Arc<Mutex<Vec<String>>>,
    pub client: reqwest::Client,
}

impl Server {
    /// Starts the binary on a free port with extra environment variables.
    pub fn start(db: &TestDb, env: &[(&str, &str)]) -> Server {
        Server::start_with(db, &["serve", "--listen", "127.0.0.1:0"], env)
    }

    /// Starts `verdict serve` with these arguments (its `--listen` among them) once it says
    /// where it listens.
    pub fn start_with(db: &TestDb, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
        cmd.args(args)
            .env("VERDICT_DATABASE_URL", &db.url)
            .env("VERDICT_MASTER_KEY", &db.master_key)
            .env("VERDICT_LOG_FORMAT", "json")
            .env("VERDICT_LOG", "debug,sqlx=warn,hyper=info,h2=info")
            .env_remove("FAILPOINTS")
            // Traces only where a test asks for them, whatever the machine's environment says.
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("listening on http://") {
                    let rest = &line[at + "listening on http://".len()..];
                    let addr: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
                        .collect();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr);
                    }
                }
                sink.lock().unwrap().push(line);
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("verdict serve did not start: {:?}", logs.lock().unwrap());
            }
        };
        Server {
            base: format!("http://{addr}"),
            child,
            logs,
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    /// Everything the server logged before this call's earlier responses (and whatever came
    /// after): the server writes its lines in order from a thread of its own, so a request
    /// marked with its own id is sent and awaited in the logs first. Assertions that something
    /// is *not* logged would otherwise pass before the line was written.
    pub fn logs(&self) -> String {
        self.settle_logs();
        self.captured()
    }

    /// What was read from the server's stderr so far.
    fn captured(&self) -> String {
        self.logs.lock().unwrap().join("\n")
    }

    /// Sends `GET /healthz` with a fresh request id and waits (at most 5 s) for its log line.
    /// Does nothing once the server has stopped listening.
    fn settle_logs(&self) {
        use std::io::{Read, Write};
        static MARKERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let marker = format!(
            "logs-settled-{}",
            MARKERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let addr = self.base.trim_start_matches("http://");
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = format!(
            "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nx-request-id: {marker}\r\nConnection: close\r\n\r\n"
        );
        if stream.write_all(request.as_bytes()).is_err() {
            return;
        }
        let _ = stream.read_to_end(&mut Vec::new());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline && !self.captured().contains(&marker) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the server logs `needle` within 5 s: its stderr is read on another thread, so a
    /// line written just before a response may arrive a moment after it.
    pub async fn logged(&self, needle: &str) -> bool {
        for _ in 0..100 {
            if self.captured().contains(needle) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub fn terminate(mut self) -> bool {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not stop after SIGTERM");
    }

    /// Kills the process, as a crash would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit on its own (an aborted failpoint) and returns whether it
    /// died abnormally.
    pub fn wait_for_crash(mut self) -> bool {
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return !status.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not exit at the failpoint");
    }

    /// Posts `body` as `content_type` to `path`, with `api_key` as the bearer, to a server that
    /// is expected to die at a failpoint on the way.
    pub async fn post_expecting_crash(
        &self,
        path: &str,
        api_key: &str,
        content_type: &str,
        body: &str,
    ) {
        let sent = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(api_key)
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .await;
        assert!(sent.is_err(), "the connection dies with the process");
    }

    /// Sends a keyed signal to a server that is expected to die at a failpoint on the way.
    pub async fn send_raw_expecting_crash(&self, tenant: &Tenant, key: &str, body: &str) {
        let req = signed(
            self.client.post(format!("{}/v1/signals", self.base)),
            tenant,
            Some(key),
            body,
            now(),
        );
        assert!(
            req.send().await.is_err(),
            "the connection dies with the process"
        );
    }

    /// A GET with the tenant's API key.
    pub async fn get(&self, tenant: &Tenant, path: &str) -> Reply {
        Reply::from(
            self.client
                .get(format!("{}{path}", self.base))
                .bearer_auth(&tenant.api_key)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// `GET /v1/events/{id}` as `tenant`, which must answer 200; its JSON.
    pub async fn event(&self, tenant: &Tenant, id: impl std::fmt::Display) -> Value {
        let reply = self.get(tenant, &format!("/v1/events/{id}")).await;
        assert_eq!(reply.status, 200, "GET /v1/events/{id}: {}", reply.text());
        reply.json()
    }

    /// `GET /metrics` (no token configured), its text.
    pub async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.base);
        let reply = self.client.get(url).send().await.unwrap();
        assert_eq!(reply.status(), 200);
        reply.text().await.unwrap()
    }

    /// `GET /openapi.json`, read whole.
    pub async fn openapi(&self) -> Reply {
        let url = format!("{}/openapi.json", self.base);
        Reply::from(self.client.get(url).send().await.unwrap()).await
    }

    /// Sends a signal body with the given key, signed for `tenant` at the current time.
    pub async fn send(&self, tenant: &Tenant, key: Option<&str>, body: &str) -> Reply {
        let req = signed(
            self.client.post(format!("{}/v1/signals", self.base)),
            tenant,
            key,
            body,
            now(),
        );
        Reply::from(req.send().await.unwrap()).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Adds the API key, content type, optional idempotency key and a `Verdict-Signature` made
/// at `timestamp` to a request.
pub fn signed(
    req: reqwest::RequestBuilder,
    tenant: &Tenant,
    key: Option<&str>,
    body: &str,
    timestamp: i64,
) -> reqwest::RequestBuilder {
    let secret = verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap();
    // `v2` covers the key (what tenants require); `v1` beside it, as the client library sends.
    let signature = format!(
        "{} {}",
        secret.sign_content_as(
            "v2",
            format!("{timestamp}.{}.{body}", key.unwrap_or("")).as_bytes()
        ),
        secret.sign_content(format!("{timestamp}.{body}").as_bytes())
    );
    let mut req = req
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("verdict-timestamp", timestamp.to_string())
        .header("verdict-signature", signature)
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    req
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// Reads a response.
    pub async fn from(resp: reqwest::Response) -> Reply {
        Reply {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            body: resp.bytes().await.unwrap().to_vec(),
        }
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {}", self.text()))
    }

    /// The body as text, for assertion messages.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether the body is an RFC 9457 problem, as every error verdict itself answers is.
    pub fn is_problem(&self) -> bool {
        self.header("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json"))
    }

    /// Whether this is a replay of a stored response.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

/// A SIM-swap signal about `phone`, observed an hour ago.
pub fn sim_swap(phone: &str) -> String {
    let observed = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    format!(
        r#"{{"type":"sim_swap","subject":{{"phone":"{phone}"}},"observed_at":"{observed}","attributes":{{"carrier":"example-mobile"}},"metadata":{{"case_ref":"abc-1"}}}}"#
    )
}

/// A SIM-swap signal about account `account`, observed `minutes_ago` minutes ago: one
/// `minutes_ago` makes one signal.
pub fn sim_swap_of_account(account: &str, minutes_ago: i64) -> String {
    let observed = time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes_ago);
    let observed = observed
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    serde_json::json!({
        "type": "sim_swap",
        "subject": {"account": account},
        "observed_at": observed,
    })
    .to_string()
}

/// Asserts `reply` is a problem+json of `status` (`what` names the case) and returns it.
pub fn assert_problem(reply: &Reply, status: u16, what: &str) -> Value {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    reply.json()
}

/// A playbook whose SIM-swap rule runs every action.
pub const ALL_ACTIONS_PLAYBOOK: &str = r#"
[[rule]]
name = "sim_swap_everything"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["lock_account", "open_case", "alert_customer", "charge_step_up", "deny", "callback"]
"#;

/// Environment for a server whose delivery worker a test drives by hand with `worker --once`,
/// with callbacks to this machine allowed.
pub const MANUAL_WORKER: [(&str, &str); 3] = [
    ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
    ("VERDICT_RETRY_INTERVAL_SECS", "1"),
    ("VERDICT_NO_WORKER", "1"),
];

/// Where test tenants' callbacks point when a test does not receive them: a closed port.
pub const UNUSED_CALLBACK: &str = "http://127.0.0.1:9/hook";

/// Appends a server's log to `<VERDICT_FAULTS_LOG_DIR>/<scenario>.log` when that is set (by
/// `scripts/faults`), for a person to read after a run; does nothing otherwise.
pub fn keep_log(scenario: &str, logs: &str) {
    use std::io::Write;
    let Ok(dir) = std::env::var("VERDICT_FAULTS_LOG_DIR") else {
        return;
    };
    let name: String = scenario
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(format!("{dir}/{name}.log"))
    {
        let _ = writeln!(file, "{logs}");
    }
}

/// A random number in `lo..=hi` (no RNG crate needed: UUIDv4s are random).
pub fn random_between(lo: u64, hi: u64) -> u64 {
    lo + (Uuid::new_v4().as_u128() % u128::from(hi - lo + 1)) as u64
}

/// Posts `body` as JSON to `path` with the tenant's API key.
pub async fn post_json(server: &Server, tenant: &Tenant, path: &str, body: Value) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}{path}", server.base))
            .bearer_auth(&tenant.api_key)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The result of `action` among a decision's (or an event's) `actions`.
pub fn action_outcome<'a>(reply: &'a Value, action: &str) -> &'a Value {
    reply["actions"]
        .as_array()
        .unwrap_or_else(|| panic!("no actions in {reply}"))
        .iter()
        .find(|a| a["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {reply}"))
}

/// A fresh random UUIDv4 idempotency key.
pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}

/// Sends with `send` until the answer is not 409, for up to 5 s: a key a dead holder left in
/// flight is taken over once its lock runs out.
pub async fn until_not_in_progress<F, Fut>(mut send: F) -> Reply
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    let mut reply = send().await;
    for _ in 0..50 {
        if reply.status != 409 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        reply = send().await;
    }
    reply
}
