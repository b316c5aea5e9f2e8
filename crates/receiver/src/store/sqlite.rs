//! Records in a SQLite file: survives restarts of a single receiver process.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::Row as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use crate::ReceiveError;

/// Records in a SQLite database, in the table [`TABLE`](super::TABLE).
#[derive(Clone, Debug)]
pub struct SqliteDedupStore {
    pool: SqlitePool,
}

impl SqliteDedupStore {
    /// Opens (creating if missing) the database file at `path` and the table in it.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteDedupStore, ReceiveError> {
        let options = SqliteConnectOptions::new().filename(path.as_ref());
        SqliteDedupStore::connect_with(options).await
    }

    /// Opens the database a `sqlite:` URL names (creating it if missing) and the table in it.
    pub async fn connect(url: &str) -> Result<SqliteDedupStore, ReceiveError> {
        SqliteDedupStore::connect_with(SqliteConnectOptions::from_str(url)?).await
    }

    async fn connect_with(options: SqliteConnectOptions) -> Result<SqliteDedupStore, ReceiveError> {
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a record acknowledged with 2xx survives power loss, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5));
        // Every operation writes, and SQLite has one writer at a time: one connection avoids
        // our own connections waiting on each other.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        SqliteDedupStore::new(pool).await
    }

    /// Uses an existing pool, creating the table if missing.
    pub async fn new(pool: SqlitePool) -> Result<SqliteDedupStore, ReceiveError> {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS verdict_received_webhooks (
                id BLOB PRIMARY KEY,
                webhook_id TEXT UNIQUE,
                tuple_digest BLOB NOT NULL UNIQUE,
                body BLOB NOT NULL,
                received_at_ms INTEGER NOT NULL,
                lease_until_ms INTEGER NOT NULL,
                processed_at_ms INTEGER
            )",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE INDEX IF NOT EXISTS verdict_received_webhooks_received_at \
             ON verdict_received_webhooks (received_at_ms)",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE INDEX IF NOT EXISTS verdict_received_webhooks_pending \
             ON verdict_received_webhooks (lease_until_ms) WHERE processed_at_ms IS NULL",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(SqliteDedupStore { pool })
    }

    /// IMMEDIATE takes the write lock up front, so another process cannot slip in between the
    /// delete of an expired match and the insert.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// The underlying pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// Leases unprocessed records in one statement, so another process cannot split the select
/// from the lease.
const LEASE_PENDING: &str = "UPDATE verdict_received_webhooks SET lease_until_ms = $1 \
     WHERE id IN (SELECT id FROM verdict_received_webhooks \
                  WHERE processed_at_ms IS NULL AND lease_until_ms <= $2 \
                  ORDER BY received_at_ms LIMIT $3) \
     RETURNING id, webhook_id, tuple_digest, body, received_at_ms, lease_until_ms";

sql_dedup_store!(SqliteDedupStore, SqliteRow, LEASE_PENDING);
