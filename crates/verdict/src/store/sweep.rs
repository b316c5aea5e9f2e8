//! Where the pruner's sweep has got to, kept so that a restarted server resumes it instead of
//! starting from the oldest rows (whose index entries, until a vacuum, are the rows pruned
//! before: the first batch of a sweep from them walks all of those).

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::StoreError;
use super::backend::{Backend, SqlDb};

/// A sweep's position: from where its batches go on, the oldest row its batches left behind,
/// and when it and the last sweep from the oldest rows started (unix ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct SweepPosition {
    /// The expiry from which keys are still to be deleted.
    pub keys_from: i64,
    /// The creation time from which events are still to be deleted.
    pub events_from: i64,
    /// The earliest expiry at which a batch left a key (deleted concurrently, or updated).
    pub keys_left: Option<i64>,
    /// The earliest creation time at which a batch left an event (a pending delivery's).
    pub events_left: Option<i64>,
    pub started_at: i64,
    pub whole_started_at: i64,
}

/// The pruner's sweep position, one row for the database.
#[async_trait]
pub trait SweepStore {
    /// The position saved last, if any.
    async fn sweep_position(&self) -> Result<Option<SweepPosition>, StoreError>;
    /// Saves `position` over the last one.
    async fn save_sweep_position(&self, position: &SweepPosition) -> Result<(), StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> SweepStore for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB> + Decode<'e, DB>,
{
    async fn sweep_position(&self) -> Result<Option<SweepPosition>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT keys_from, events_from, keys_left, events_left, started_at, \
             whole_started_at FROM retention_sweep WHERE id = 1",
        )
        .fetch_optional(self.read())
        .await?)
    }

    async fn save_sweep_position(&self, position: &SweepPosition) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO retention_sweep (id, keys_from, events_from, keys_left, events_left, \
             started_at, whole_started_at) VALUES (1, $1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET keys_from = excluded.keys_from, \
             events_from = excluded.events_from, keys_left = excluded.keys_left, \
             events_left = excluded.events_left, started_at = excluded.started_at, \
             whole_started_at = excluded.whole_started_at",
        )
        .bind(position.keys_from)
        .bind(position.events_from)
        .bind(position.keys_left)
        .bind(position.events_left)
        .bind(position.started_at)
        .bind(position.whole_started_at)
        .execute(self.write())
        .await?;
        Ok(())
    }
}
