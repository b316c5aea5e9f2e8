//! Records in PostgreSQL: shared by several receiver processes behind a load balancer.

use std::time::Duration;

use sqlx::Row as _;
use sqlx::postgres::{PgPool, PgPoolOptions, PgRow};

use crate::ReceiveError;

/// Records in a PostgreSQL database, in the table [`TABLE`](super::TABLE).
#[derive(Clone, Debug)]
pub struct PostgresDedupStore {
    pool: PgPool,
}

impl PostgresDedupStore {
    /// Connects to `url` and creates the table if missing.
    pub async fn connect(url: &str) -> Result<PostgresDedupStore, ReceiveError> {
        let pool = PgPoolOptions::new()
            .max_connections(8)
            // Fail fast when the database is away: the sender's attempt has a deadline of its
            // own, and a prompt 503 makes it retry later.
            .acquire_timeout(Duration::from_secs(3))
            .connect(url)
            .await?;
        PostgresDedupStore::new(pool).await
    }

    /// Uses an existing pool, creating the table if missing.
    pub async fn new(pool: PgPool) -> Result<PostgresDedupStore, ReceiveError> {
        let mut tx = pool.begin().await?;
        // Several instances starting at once would race on CREATE TABLE IF NOT EXISTS.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('verdict_received_webhooks'))")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS verdict_received_webhooks (
                id UUID PRIMARY KEY,
                webhook_id TEXT UNIQUE,
                tuple_digest BYTEA NOT NULL UNIQUE,
                body BYTEA NOT NULL,
                received_at_ms BIGINT NOT NULL,
                lease_until_ms BIGINT NOT NULL,
                processed_at_ms BIGINT
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
        Ok(PostgresDedupStore { pool })
    }

    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
        self.pool.begin().await
    }

    /// The underlying pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// Leases unprocessed records; `SKIP LOCKED` gives instances recovering at once disjoint
/// records.
const LEASE_PENDING: &str = "UPDATE verdict_received_webhooks SET lease_until_ms = $1 \
     WHERE id IN (SELECT id FROM verdict_received_webhooks \
                  WHERE processed_at_ms IS NULL AND lease_until_ms <= $2 \
                  ORDER BY received_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED) \
     RETURNING id, webhook_id, tuple_digest, body, received_at_ms, lease_until_ms";

sql_dedup_store!(PostgresDedupStore, PgRow, LEASE_PENDING);
