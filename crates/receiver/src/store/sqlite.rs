//! Records in a SQLite file: survives restarts of a single receiver process.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row as _;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use uuid::Uuid;

use super::{DedupStore, Record, RecordOutcome, TupleDigest};
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

    /// The underlying pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

fn record_from_row(row: &SqliteRow) -> Result<Record, ReceiveError> {
    let digest: Vec<u8> = row.try_get("tuple_digest")?;
    let digest = <[u8; 32]>::try_from(digest.as_slice())
        .map_err(|_| ReceiveError::store("stored tuple digest is not 32 bytes"))?;
    Ok(Record {
        id: row.try_get("id")?,
        webhook_id: row.try_get("webhook_id")?,
        tuple_digest: TupleDigest(digest),
        body: row.try_get("body")?,
        received_at_ms: row.try_get("received_at_ms")?,
        lease_until_ms: row.try_get("lease_until_ms")?,
    })
}

#[async_trait]
impl DedupStore for SqliteDedupStore {
    #[tracing::instrument(skip_all, fields(webhook_id = ?record.webhook_id))]
    async fn record(
        &self,
        record: &Record,
        horizon_start_ms: i64,
    ) -> Result<RecordOutcome, ReceiveError> {
        // IMMEDIATE takes the write lock up front, so another process cannot slip in between
        // the delete of an expired match and the insert.
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "DELETE FROM verdict_received_webhooks \
             WHERE (webhook_id = $1 OR tuple_digest = $2) \
             AND received_at_ms < $3 AND processed_at_ms IS NOT NULL",
        )
        .bind(&record.webhook_id)
        .bind(&record.tuple_digest.0[..])
        .bind(horizon_start_ms)
        .execute(&mut *tx)
        .await?;
        let inserted = sqlx::query(
            "INSERT INTO verdict_received_webhooks \
             (id, webhook_id, tuple_digest, body, received_at_ms, lease_until_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        )
        .bind(record.id)
        .bind(&record.webhook_id)
        .bind(&record.tuple_digest.0[..])
        .bind(&record.body)
        .bind(record.received_at_ms)
        .bind(record.lease_until_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(if inserted == 1 {
            RecordOutcome::Recorded
        } else {
            RecordOutcome::Duplicate
        })
    }

    async fn mark_processed(&self, id: Uuid, now_ms: i64) -> Result<(), ReceiveError> {
        sqlx::query(
            "UPDATE verdict_received_webhooks SET processed_at_ms = $2 \
             WHERE id = $1 AND processed_at_ms IS NULL",
        )
        .bind(id)
        .bind(now_ms)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn lease_pending(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: u32,
    ) -> Result<Vec<Record>, ReceiveError> {
        // One statement: the select and the lease cannot be split by another process.
        let rows = sqlx::query(
            "UPDATE verdict_received_webhooks SET lease_until_ms = $1 \
             WHERE id IN (SELECT id FROM verdict_received_webhooks \
                          WHERE processed_at_ms IS NULL AND lease_until_ms <= $2 \
                          ORDER BY received_at_ms LIMIT $3) \
             RETURNING id, webhook_id, tuple_digest, body, received_at_ms, lease_until_ms",
        )
        .bind(lease_until_ms)
        .bind(now_ms)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut records = rows
            .iter()
            .map(record_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        records.sort_by_key(|r| r.received_at_ms);
        Ok(records)
    }

    async fn prune(&self, horizon_start_ms: i64) -> Result<u64, ReceiveError> {
        let deleted = sqlx::query(
            "DELETE FROM verdict_received_webhooks \
             WHERE received_at_ms < $1 AND processed_at_ms IS NOT NULL",
        )
        .bind(horizon_start_ms)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(deleted)
    }
}
