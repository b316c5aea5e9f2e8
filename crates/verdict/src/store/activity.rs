//! Activity: what the console's live numbers and event filters read. Reads only.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::backend::{Backend, SqlDb};
use super::{EventRecord, StoreError};

/// Which events to list; every present field must match.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// The signal type's wire name.
    pub signal_type: Option<String>,
    /// The decision's wire name.
    pub decision: Option<String>,
    /// Created at or after (unix ms).
    pub since: Option<i64>,
    /// Created before (unix ms).
    pub until: Option<i64>,
}

/// Events of one minute with one decision.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct MinuteCount {
    /// Minutes since the unix epoch.
    pub minute: i64,
    pub decision: String,
    pub events: i64,
}

/// A tenant's recent activity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Activity {
    pub per_minute: Vec<MinuteCount>,
    /// Delivery attempts that got a 2xx, and all attempts.
    pub attempts_succeeded: i64,
    pub attempts: i64,
    /// The tenant's deliveries waiting for an attempt.
    pub queue_depth: i64,
}

/// A playbook version without its source.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PlaybookVersion {
    pub version: i64,
    pub format: String,
    pub created_at: i64,
}

/// Reads for the console.
#[async_trait]
pub trait ActivityStore {
    /// The tenant's events matching `filter`, newest first, older than `before` when given.
    async fn filtered_events(
        &self,
        tenant_id: Uuid,
        filter: &EventFilter,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<EventRecord>, StoreError>;
    /// Events per minute and decision, delivery attempts and the queue, since `since`.
    async fn activity(&self, tenant_id: Uuid, since: i64) -> Result<Activity, StoreError>;
    /// The tenant's newest playbook versions, newest first.
    async fn playbook_history(
        &self,
        tenant_id: Uuid,
        limit: i64,
    ) -> Result<Vec<PlaybookVersion>, StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> ActivityStore for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    async fn filtered_events(
        &self,
        tenant_id: uuid::Uuid,
        filter: &crate::store::EventFilter,
        before: Option<uuid::Uuid>,
        limit: i64,
    ) -> Result<Vec<crate::store::EventRecord>, crate::store::StoreError> {
        let mut q = sqlx::QueryBuilder::<DB>::new("SELECT ");
        q.push(crate::store::events::EVENT_COLUMNS);
        q.push(" FROM events WHERE tenant_id = ");
        q.push_bind(tenant_id);
        q.push(" AND id < ");
        q.push_bind(before.unwrap_or(uuid::Uuid::max()));
        if let Some(t) = &filter.signal_type {
            q.push(" AND signal_type = ").push_bind(t.clone());
        }
        if let Some(d) = &filter.decision {
            q.push(" AND decision = ").push_bind(d.clone());
        }
        if let Some(since) = filter.since {
            q.push(" AND created_at >= ").push_bind(since);
        }
        if let Some(until) = filter.until {
            q.push(" AND created_at < ").push_bind(until);
        }
        q.push(" ORDER BY id DESC LIMIT ").push_bind(limit);
        Ok(q.build_query_as().fetch_all(self.read()).await?)
    }

    async fn activity(
        &self,
        tenant_id: uuid::Uuid,
        since: i64,
    ) -> Result<crate::store::Activity, crate::store::StoreError> {
        let per_minute = sqlx::query_as(
            "SELECT created_at / 60000 AS minute, decision, COUNT(*) AS events \
             FROM events WHERE tenant_id = $1 AND created_at >= $2 \
             GROUP BY created_at / 60000, decision ORDER BY minute",
        )
        .bind(tenant_id)
        .bind(since)
        .fetch_all(self.read())
        .await?;
        let (attempts_succeeded, attempts): (i64, i64) = sqlx::query_as(
            "SELECT COALESCE(SUM(CASE WHEN status_code BETWEEN 200 AND 299 \
             THEN 1 ELSE 0 END), 0), COUNT(*) FROM ( \
             SELECT a.status_code FROM delivery_attempts a \
             JOIN deliveries d ON d.id = a.delivery_id \
             WHERE d.tenant_id = $1 AND a.attempted_at >= $2 \
             UNION ALL SELECT inline_status_code FROM deliveries \
             WHERE tenant_id = $1 AND inline_attempted_at >= $2) x",
        )
        .bind(tenant_id)
        .bind(since)
        .fetch_one(self.read())
        .await?;
        let queue_depth =
            sqlx::query_scalar("SELECT COUNT(*) FROM delivery_queue WHERE tenant_id = $1")
                .bind(tenant_id)
                .fetch_one(self.read())
                .await?;
        Ok(crate::store::Activity {
            per_minute,
            attempts_succeeded,
            attempts,
            queue_depth,
        })
    }

    async fn playbook_history(
        &self,
        tenant_id: uuid::Uuid,
        limit: i64,
    ) -> Result<Vec<crate::store::PlaybookVersion>, crate::store::StoreError> {
        Ok(sqlx::query_as(
            "SELECT version, format, created_at FROM playbooks WHERE tenant_id = $1 \
             ORDER BY version DESC LIMIT $2",
        )
        .bind(tenant_id)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }
}
