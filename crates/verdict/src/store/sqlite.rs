//! The embedded backend: one SQLite file in WAL mode.
//!
//! SQLite has one writer at a time, so writes go through a one-connection pool (queueing in
//! the pool instead of busy-waiting between our own connections) and reads through a small
//! pool beside it. Write transactions start with `BEGIN IMMEDIATE` so they take the write lock
//! up front instead of failing to upgrade a read lock half-way.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use super::StoreError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// SQLite-backed storage.
#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file a `sqlite:` URL names.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // The group commit's multi-row statements differ by row count: keep every shape
        // prepared instead of re-preparing them as they evict each other.
        let options = SqliteConnectOptions::from_str(url)?
            .statement_cache_capacity(super::pipeline::STATEMENT_SHAPES)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed claim or completion survives power loss, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        // A pool pings each connection it hands out unless told otherwise: a thread hop per
        // group commit. An SQLite connection is a file handle in this process and cannot
        // break while idle, so the ping checks nothing.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.read_only(true))
            .await?;
        Ok(Self { writer, reader })
    }

    /// The pool every write goes through.
    pub fn write(&self) -> &SqlitePool {
        &self.writer
    }

    /// The pool reads go through.
    pub fn read(&self) -> &SqlitePool {
        &self.reader
    }

    /// The pool the decision reads go through: the readers'.
    pub fn decisions(&self) -> &SqlitePool {
        &self.reader
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.writer.begin_with("BEGIN IMMEDIATE").await
    }
}

/// Leases due deliveries; SQLite's single writer makes the `UPDATE` atomic across workers.
/// How a read that must see one snapshot begins (a read transaction in WAL mode keeps one snapshot until it ends).
const READ_SNAPSHOT: &str = "BEGIN";

const LEASE_DUE: &str = "UPDATE deliveries SET leased_until = $2 WHERE id IN ( \
     SELECT d.id FROM deliveries d JOIN tenants t ON t.id = d.tenant_id \
     WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND d.leased_until <= $1 \
     AND d.updated_at < $4 AND d.retries_left > 0 AND NOT t.callback_disabled \
     AND lower(hex(d.tenant_id)) NOT IN (SELECT replace(value, '-', '') FROM json_each($5)) \
     ORDER BY d.next_attempt_at LIMIT $3) \
     RETURNING id, tenant_id, webhook_id, payload, retries_left, \
     (SELECT callback_url FROM tenants WHERE tenants.id = deliveries.tenant_id) AS callback_url";

/// Whether a query may hold several statements: SQLite runs them in turn, in one hop to its
/// connection thread.
const MULTI_STATEMENT: bool = true;

sql_store!(SqliteStore, sqlx::SqliteConnection, LEASE_DUE, 1);
// SQLite runs the group commit's statements one by one: they are calls, not round trips.
pipeline_sql!(SqliteStore, sqlx::SqliteConnection);
