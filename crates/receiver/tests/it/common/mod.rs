//! The one test helper module: envelopes, signed headers, fresh stores of every kind, and a
//! router on a real socket.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use sqlx::PgPool;
use uuid::Uuid;
use verdict_receiver::{DedupStore, MemoryDedupStore, PostgresDedupStore, SqliteDedupStore};
use verdict_webhooks::{Envelope, Secret, signed_headers};

/// A fixed "now" for tests that drive time by hand (unix seconds).
pub const NOW: i64 = 1_780_000_000;

/// A distinct envelope per `n`.
pub fn envelope(n: u32) -> Envelope {
    Envelope {
        event_id: format!("evt_{n}"),
        tenant: "tenant_1".into(),
        event_type: "decision.sim_swap".into(),
        subject_hash: format!("{n:064x}"),
        timestamp: "2026-05-28T12:00:00Z".into(),
        decision: "deny".into(),
        actions: serde_json::json!([{"action": "lock_account", "outcome": "locked"}]),
        metadata: serde_json::json!({"case": n}),
        feed: "signals".into(),
    }
}

/// The body bytes verdict would send for `envelope`.
pub fn body(envelope: &Envelope) -> Vec<u8> {
    serde_json::to_vec(envelope).expect("envelopes serialise")
}

/// Standard Webhooks headers for `body`, signed with `secret` at `timestamp`.
pub fn signed(secret: &Secret, webhook_id: &str, timestamp: i64, body: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in signed_headers(std::slice::from_ref(secret), webhook_id, timestamp, body) {
        map.insert(
            HeaderName::from_static(name),
            HeaderValue::from_str(&value).expect("signed headers are valid header values"),
        );
    }
    map
}

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let dir = std::env::temp_dir().join(format!("verdict-receiver-{}", Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The PostgreSQL server tests create their databases on.
pub fn pg_admin_url() -> String {
    std::env::var("VERDICT_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A PostgreSQL database of its own, named with a UUID, dropped afterwards.
pub struct TestPg {
    pub url: String,
    name: String,
}

impl TestPg {
    pub async fn new() -> TestPg {
        let name = format!("verdict_receiver_test_{}", Uuid::new_v4().simple());
        let admin = PgPool::connect(&pg_admin_url())
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL unreachable at {}: {e}", pg_admin_url()));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .expect("create test database");
        admin.close().await;
        let base = pg_admin_url();
        let server = &base[..base.rfind('/').expect("the admin URL names a database")];
        TestPg {
            url: format!("{server}/{name}"),
            name,
        }
    }
}

impl Drop for TestPg {
    fn drop(&mut self) {
        // Drop may run on a runtime thread, so use a short-lived runtime on a thread of its own.
        let name = std::mem::take(&mut self.name);
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(admin) = PgPool::connect(&pg_admin_url()).await {
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

/// Which store a behaviour test runs against.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Memory,
    Sqlite,
    Postgres,
}

/// A fresh, empty store of one kind, with whatever must outlive it.
pub struct TestStore {
    pub store: Arc<dyn DedupStore>,
    _dir: Option<TempDir>,
    _pg: Option<TestPg>,
}

impl TestStore {
    pub async fn new(kind: Kind) -> TestStore {
        match kind {
            Kind::Memory => TestStore {
                store: Arc::new(MemoryDedupStore::new()),
                _dir: None,
                _pg: None,
            },
            Kind::Sqlite => {
                let dir = TempDir::new();
                let store = SqliteDedupStore::open(dir.path().join("received.db"))
                    .await
                    .expect("open sqlite store");
                TestStore {
                    store: Arc::new(store),
                    _dir: Some(dir),
                    _pg: None,
                }
            }
            Kind::Postgres => {
                let pg = TestPg::new().await;
                let store = PostgresDedupStore::connect(&pg.url)
                    .await
                    .expect("connect postgres store");
                TestStore {
                    store: Arc::new(store),
                    _dir: None,
                    _pg: Some(pg),
                }
            }
        }
    }
}

/// Runs each `async fn name(store: Arc<dyn DedupStore>)` in the calling file against every store,
/// as `memory::name`, `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! for_each_store {
    ($($name:ident),* $(,)?) => {
        $crate::for_each_store!(@kind memory, Memory, $($name),*);
        $crate::for_each_store!(@kind sqlite, Sqlite, $($name),*);
        $crate::for_each_store!(@kind postgres, Postgres, $($name),*);
    };
    (@kind $module:ident, $kind:ident, $($name:ident),*) => {
        mod $module {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let test = $crate::common::TestStore::new($crate::common::Kind::$kind).await;
                    super::$name(std::sync::Arc::clone(&test.store)).await
                }
            )*
        }
    };
}

/// Serves `router` on 127.0.0.1 at a free port; returns its base URL.
pub async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

/// Events a test handler was given, in order.
pub type Seen = Arc<std::sync::Mutex<Vec<verdict_receiver::Event>>>;

/// A handler that remembers every event it is handed.
pub fn recording_handler() -> (impl verdict_receiver::Handler, Seen) {
    let seen: Seen = Arc::default();
    let handler = {
        let seen = Arc::clone(&seen);
        move |event: verdict_receiver::Event| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().expect("seen lock").push(event);
                Ok::<_, std::convert::Infallible>(())
            }
        }
    };
    (handler, seen)
}

/// How many events `seen` holds.
pub fn count(seen: &Seen) -> usize {
    seen.lock().expect("seen lock").len()
}
