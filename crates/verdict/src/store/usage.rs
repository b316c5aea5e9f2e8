//! Events stored per tenant and UTC day: what the daily quota reads. Instances add their own
//! counts every few seconds ([`crate::quota`]), so no signal waits on this table.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};

/// Each tenant's events stored a day.
#[async_trait]
pub trait UsageStore {
    /// Adds `counts` (tenant, events) to `day`'s (days since the Unix epoch, UTC), in one
    /// transaction.
    async fn add_usage(&self, day: i64, counts: &[(Uuid, i64)]) -> Result<(), StoreError>;
    /// Each tenant's events stored on `day`, summed across instances.
    async fn usage_on(&self, day: i64) -> Result<Vec<(Uuid, i64)>, StoreError>;
    /// Drops the counts of the days before `day`.
    async fn prune_usage(&self, before_day: i64) -> Result<u64, StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> UsageStore for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
{
    async fn add_usage(&self, day: i64, counts: &[(Uuid, i64)]) -> Result<(), StoreError> {
        if counts.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        for (tenant_id, events) in counts {
            sqlx::query(
                "INSERT INTO tenant_usage (tenant_id, day, events) VALUES ($1, $2, $3) \
                 ON CONFLICT (tenant_id, day) \
                 DO UPDATE SET events = tenant_usage.events + excluded.events",
            )
            .bind(*tenant_id)
            .bind(day)
            .bind(*events)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn usage_on(&self, day: i64) -> Result<Vec<(Uuid, i64)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT tenant_id, events FROM tenant_usage WHERE day = $1")
                .bind(day)
                .fetch_all(self.read())
                .await?,
        )
    }

    async fn prune_usage(&self, before_day: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM tenant_usage WHERE day < $1")
            .bind(before_day)
            .execute(self.write())
            .await?;
        Ok(DB::rows_affected(&done))
    }
}
