//! Events: each decided signal, without raw identifiers, with what its decision evaluated.

use async_trait::async_trait;
use uuid::Uuid;

use super::StoreError;

/// An event (the signal without raw identifiers, and its decision) to persist.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub signal_type: &'static str,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    pub metadata: String,
    pub decision: &'static str,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: String,
    pub created_at: i64,
    /// When the playbook evaluated the signal (unix ms).
    pub evaluated_at: i64,
    /// The subject facts it evaluated (JSON).
    pub facts: String,
}

/// An event as read back.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct EventRecord {
    pub id: Uuid,
    pub signal_type: String,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    pub metadata: String,
    pub decision: String,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: String,
    pub created_at: i64,
    pub evaluated_at: i64,
    pub facts: String,
}

/// The columns of [`EventRecord`].
pub(crate) const EVENT_COLUMNS: &str = "id, signal_type, subject_hash, observed_at, attributes, \
     metadata, decision, playbook_version, rule, actions, created_at, evaluated_at, facts";

/// Reads of events.
#[async_trait]
pub trait EventStore {
    /// The tenant's events, newest first, older than `before` when given.
    async fn events(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<EventRecord>, StoreError>;
    /// One of the tenant's events.
    async fn event(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<EventRecord>, StoreError>;
}

/// Implements [`EventStore`] and the batched event insert for a backend.
macro_rules! events_sql {
    ($store:ty, $conn:ty) => {
        /// Inserts events in one statement; an event already stored (a retry) is left alone.
        async fn insert_events(
            conn: &mut $conn,
            events: &[&$crate::store::NewEvent],
        ) -> Result<(), sqlx::Error> {
            if events.is_empty() {
                return Ok(());
            }
            let mut q = sqlx::QueryBuilder::<Db>::new(
                "INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, \
                 attributes, metadata, decision, playbook_version, rule, actions, created_at, \
                 evaluated_at, facts) ",
            );
            q.push_values(events, |mut row, e| {
                row.push_bind(e.id)
                    .push_bind(e.tenant_id)
                    .push_bind(e.signal_type)
                    .push_bind(e.subject_hash.clone())
                    .push_bind(e.observed_at)
                    .push_bind(e.attributes.clone())
                    .push_bind(e.metadata.clone())
                    .push_bind(e.decision)
                    .push_bind(e.playbook_version)
                    .push_bind(e.rule.clone())
                    .push_bind(e.actions.clone())
                    .push_bind(e.created_at)
                    .push_bind(e.evaluated_at)
                    .push_bind(e.facts.clone());
            });
            q.push(" ON CONFLICT DO NOTHING");
            q.build().execute(conn).await?;
            Ok(())
        }

        #[async_trait::async_trait]
        impl $crate::store::EventStore for $store {
            async fn events(
                &self,
                tenant_id: uuid::Uuid,
                before: Option<uuid::Uuid>,
                limit: i64,
            ) -> Result<Vec<$crate::store::EventRecord>, $crate::store::StoreError> {
                // UUIDv7 ids sort by creation time, so the id is the pagination cursor; "no
                // cursor" is the max UUID.
                let sql = format!(
                    "SELECT {} FROM events WHERE tenant_id = $1 AND id < $2 \
                     ORDER BY id DESC LIMIT $3",
                    $crate::store::events::EVENT_COLUMNS
                );
                Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(tenant_id)
                .bind(before.unwrap_or(uuid::Uuid::max()))
                .bind(limit)
                .fetch_all(self.read())
                .await?)
            }

            async fn event(
                &self,
                tenant_id: uuid::Uuid,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::store::EventRecord>, $crate::store::StoreError> {
                let sql = format!(
                    "SELECT {} FROM events WHERE tenant_id = $1 AND id = $2",
                    $crate::store::events::EVENT_COLUMNS
                );
                Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(self.read())
                .await?)
            }
        }
    };
}
