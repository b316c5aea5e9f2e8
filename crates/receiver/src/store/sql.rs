//! The statements both SQL dedup stores run, written once: every one is portable between SQLite
//! and PostgreSQL (`$N` placeholders, `ON CONFLICT DO NOTHING`, `RETURNING`). A backend provides
//! a `pool` field, a `begin()` that opens a write transaction, and its own lease statement.

/// Implements `DedupStore` for `$store`, whose rows are `$row`, leasing with `$lease_pending`.
macro_rules! sql_dedup_store {
    ($store:ty, $row:ty, $lease_pending:expr) => {
        fn record_from_row(row: &$row) -> Result<$crate::store::Record, $crate::ReceiveError> {
            let digest: Vec<u8> = row.try_get("tuple_digest")?;
            let digest = <[u8; 32]>::try_from(digest.as_slice())
                .map_err(|_| $crate::ReceiveError::store("stored tuple digest is not 32 bytes"))?;
            Ok($crate::store::Record {
                id: row.try_get("id")?,
                webhook_id: row.try_get("webhook_id")?,
                tuple_digest: $crate::store::TupleDigest(digest),
                body: row.try_get("body")?,
                received_at_ms: row.try_get("received_at_ms")?,
                lease_until_ms: row.try_get("lease_until_ms")?,
            })
        }

        #[async_trait::async_trait]
        impl $crate::store::DedupStore for $store {
            #[tracing::instrument(skip_all, fields(webhook_id = ?record.webhook_id))]
            async fn record(
                &self,
                record: &$crate::store::Record,
                horizon_start_ms: i64,
            ) -> Result<$crate::store::RecordOutcome, $crate::ReceiveError> {
                let mut tx = self.begin().await?;
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
                // The unique indexes decide a race between two deliveries of one event: no
                // read-then-write.
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
                    $crate::store::RecordOutcome::Recorded
                } else {
                    $crate::store::RecordOutcome::Duplicate
                })
            }

            async fn mark_processed(
                &self,
                id: uuid::Uuid,
                now_ms: i64,
            ) -> Result<(), $crate::ReceiveError> {
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
            ) -> Result<Vec<$crate::store::Record>, $crate::ReceiveError> {
                let rows = sqlx::query($lease_pending)
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

            async fn prune(&self, horizon_start_ms: i64) -> Result<u64, $crate::ReceiveError> {
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
    };
}
