//! Events: each decided signal, without raw identifiers, with what its decision evaluated.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};
use super::deliveries::delete_settled_deliveries;
use super::failpoint::failpoint;
use crate::domain::{Decision, Feed};

/// An event (the signal without raw identifiers, and its decision) to persist.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// The signal type's name, or `unmapped` for a feed event no signal type maps to.
    pub signal_type: &'static str,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    /// Empty when `metadata_in_callback`.
    pub metadata: String,
    /// Whether the metadata is stored in the event's callback envelope (the event's own
    /// callback holds it, in bytes kept fixed for every retry) rather than in `metadata`.
    pub metadata_in_callback: bool,
    pub decision: Decision,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: String,
    pub created_at: i64,
    /// When the playbook evaluated the signal (unix ms).
    pub evaluated_at: i64,
    /// The subject facts it evaluated (JSON).
    pub facts: String,
    /// The feed it came in through.
    pub feed: Feed,
    /// The signal's key ([`super::ActionTarget::signal_key`]); empty for an unmapped feed event.
    pub signal_key: Vec<u8>,
}

/// An event as read back.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct EventRecord {
    pub id: Uuid,
    /// The signal type's name, or `unmapped` for a feed event no signal type maps to.
    pub signal_type: String,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    /// The metadata column: empty when the metadata is stored in the callback's envelope
    /// instead (read it with [`EventRecord::metadata`]).
    #[sqlx(rename = "metadata")]
    pub stored_metadata: String,
    #[sqlx(try_from = "String")]
    pub decision: Decision,
    pub playbook_version: i64,
    pub rule: String,
    /// The actions column, in its stored form (read it with [`EventRecord::actions`]).
    #[sqlx(rename = "actions")]
    pub stored_actions: String,
    pub created_at: i64,
    pub evaluated_at: i64,
    pub facts: String,
    #[sqlx(try_from = "String")]
    pub feed: Feed,
    pub signal_key: Vec<u8>,
    /// The callback's envelope, read only when the metadata is stored there.
    pub callback_payload: Option<Vec<u8>>,
}

impl EventRecord {
    /// Each action and its outcome, JSON, whichever form they are stored in (the column as it
    /// is if it is neither, which then reads as no JSON).
    pub fn actions(&self) -> String {
        crate::domain::stored_actions::as_json(&self.stored_actions).map_or_else(
            |_| self.stored_actions.clone(),
            std::borrow::Cow::into_owned,
        )
    }

    /// The signal's metadata, JSON: the event's own, or its callback envelope's `metadata`
    /// where it is stored once for an event with a callback.
    pub fn metadata(&self) -> String {
        match &self.callback_payload {
            None => self.stored_metadata.clone(),
            Some(envelope) => serde_json::from_slice::<serde_json::Value>(envelope)
                .ok()
                .and_then(|mut envelope| envelope.get_mut("metadata").map(serde_json::Value::take))
                .map_or_else(|| "{}".to_owned(), |metadata| metadata.to_string()),
        }
    }
}

/// The columns of [`EventRecord`], read `FROM events` (unaliased): the callback's envelope
/// only for an event whose metadata is stored there (every endpoint's row holds the same
/// bytes, so any one).
pub(crate) const EVENT_COLUMNS: &str = "id, signal_type, subject_hash, observed_at, attributes, \
     metadata, decision, playbook_version, rule, actions, created_at, evaluated_at, facts, feed, \
     signal_key, (SELECT d.payload FROM deliveries d WHERE d.event_id = events.id \
     AND d.action = 'callback' AND events.metadata_in_callback LIMIT 1) AS callback_payload";

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
    /// Deletes up to `limit` events created at `created_from` or later and before
    /// `created_before`, oldest first, in one transaction with their deliveries and the
    /// deliveries' attempts.
    /// An event with a delivery still pending (waiting, retrying or leased) is kept, delivery
    /// and all; so is one with a suspended callback, unless the event was created before
    /// `suspended_before`. The state events produced (locks, denies, cases, alert windows,
    /// ledger entries) is not theirs to take: it stays.
    async fn prune_events(
        &self,
        created_from: i64,
        created_before: i64,
        suspended_before: i64,
        limit: i64,
    ) -> Result<PrunedEvents, StoreError>;
}

/// What one pruning batch deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrunedEvents {
    /// Events examined: fewer than the limit means nothing older is left to prune.
    pub selected: u64,
    /// The latest creation time among the events examined.
    pub reached: Option<i64>,
    /// The earliest creation time before `reached` at which an event is left (its delivery
    /// pending or suspended): where the sweep must come back to.
    pub left: Option<i64>,
    pub events: u64,
    pub deliveries: u64,
    pub attempts: u64,
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> EventStore for B
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
    async fn prune_events(
        &self,
        created_from: i64,
        created_before: i64,
        suspended_before: i64,
        limit: i64,
    ) -> Result<crate::store::PrunedEvents, crate::store::StoreError> {
        let mut tx = self.begin_generic().await?;
        // Only a delivery made at the insert is suspended, so one selected here stays past
        // the bound: the deletes below take it, unless it was resumed (pending) meanwhile.
        // Both `NOT EXISTS` here end in `LIMIT 1 OFFSET 0`, which keeps each a probe of
        // `deliveries_by_event` per event (PostgreSQL does not turn a subquery with an
        // `OFFSET` into a join). As an anti-join, the planner costs a merge join too, and that
        // reads both ids' lowest index entries: the rows pruned before, dead until a vacuum.
        // On a grown database that was 5,000–8,000 buffers and 8–30 ms of planning for each
        // statement, every batch, against 0.2 ms.
        // Each row also carries the earliest event the span up to the last one picked keeps
        // (a delivery pending or suspended): where the sweep must come back to, found in the
        // same round trip as the pick.
        let picked: Vec<(uuid::Uuid, i64, Option<i64>)> = sqlx::query_as(
            "WITH picked AS (SELECT e.id, e.created_at FROM events e \
               WHERE e.created_at >= $4 AND e.created_at < $1 AND NOT EXISTS \
               (SELECT 1 FROM deliveries d WHERE d.event_id = e.id AND (d.status = 'pending' \
                  OR (d.status = 'suspended' AND e.created_at >= $3)) LIMIT 1 OFFSET 0) \
               ORDER BY e.created_at LIMIT $2) \
             SELECT p.id, p.created_at, (SELECT MIN(k.created_at) FROM events k \
               WHERE k.created_at >= $4 \
                 AND k.created_at < (SELECT MAX(m.created_at) FROM picked m) \
                 AND k.id NOT IN (SELECT n.id FROM picked n)) \
             FROM picked p",
        )
        .bind(created_before)
        .bind(limit)
        .bind(suspended_before)
        .bind(created_from)
        .fetch_all(&mut *tx)
        .await?;
        let Some(reached) = picked.iter().map(|(_, created_at, _)| *created_at).max() else {
            return Ok(Default::default());
        };
        failpoint!("prune::after_pick");
        let ids: Vec<uuid::Uuid> = picked.iter().map(|(id, _, _)| *id).collect();
        let (deliveries, attempts) = delete_settled_deliveries(&mut *tx, &ids).await?;
        // A delivery that became pending since (a redelivery) keeps its event.
        let mut q = sqlx::QueryBuilder::<DB>::new("DELETE FROM events WHERE id");
        DB::push_in_ids(&mut q, &ids);
        q.push(
            " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = events.id \
             LIMIT 1 OFFSET 0)",
        );
        let events = DB::rows_affected(&q.build().execute(&mut *tx).await?);
        // What this batch walked past and kept: what the pick saw kept, and what it picked
        // that the delete kept, looked up only when the delete fell short (rarely). Not the
        // events at `reached` itself: the next batch starts there.
        let kept_picked: Option<i64> = if events < ids.len() as u64 {
            let mut q = sqlx::QueryBuilder::<DB>::new(
                "SELECT MIN(created_at) FROM events WHERE created_at < ",
            );
            q.push_bind(reached);
            q.push(" AND id");
            DB::push_in_ids(&mut q, &ids);
            q.build_query_scalar().fetch_one(&mut *tx).await?
        } else {
            None
        };
        let left = [kept_picked, picked.first().and_then(|(_, _, left)| *left)]
            .into_iter()
            .flatten()
            .min();
        tx.commit().await?;
        Ok(crate::store::PrunedEvents {
            selected: ids.len() as u64,
            reached: Some(reached),
            left,
            events,
            deliveries,
            attempts,
        })
    }

    async fn events(
        &self,
        tenant_id: uuid::Uuid,
        before: Option<uuid::Uuid>,
        limit: i64,
    ) -> Result<Vec<crate::store::EventRecord>, crate::store::StoreError> {
        // UUIDv7 ids sort by creation time, so the id is the pagination cursor; "no
        // cursor" is the max UUID.
        let sql = format!(
            "SELECT {} FROM events WHERE tenant_id = $1 AND id < $2 \
             ORDER BY id DESC LIMIT $3",
            crate::store::events::EVENT_COLUMNS
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
    ) -> Result<Option<crate::store::EventRecord>, crate::store::StoreError> {
        let sql = format!(
            "SELECT {} FROM events WHERE tenant_id = $1 AND id = $2",
            crate::store::events::EVENT_COLUMNS
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(self.read())
            .await?)
    }
}
