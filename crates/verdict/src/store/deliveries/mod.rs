//! The callback outbox: deliveries (each built once, its bytes fixed), their leases for
//! attempts, and every attempt made.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};
use crate::domain::{ActionKind, DeliveryStatus, read_webhook_id};

mod attempts;
mod envelopes;
mod upkeep;

use attempts::{ATTEMPTS_OF, attempt_rows};
pub(crate) use attempts::{disable_endpoints, push_record_attempts, record_attempts};
use envelopes::with_envelopes;
pub(crate) use upkeep::{count_suspended, delete_settled_deliveries, resume_suspended};

/// A callback to record in the outbox; the envelope is built once, here.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    pub id: Uuid,
    pub webhook_id: String,
    pub payload: Vec<u8>,
    /// Whether its event's row renders the payload again byte for byte: the outbox row then
    /// stores none ([`DueDelivery::payload`] is filled in from the event).
    pub payload_in_event: bool,
    /// Reserved for the inline attempt until then; if the process dies, the worker takes it.
    pub leased_until: i64,
    /// `Pending`, or `Suspended` while the endpoint is disabled (no attempt is made).
    pub status: DeliveryStatus,
    /// The endpoint it goes to.
    pub endpoint_id: Uuid,
}

/// A delivery leased for an attempt, with where it goes.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct DueDelivery {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    /// As stored: empty where [`Self::webhook_id`] derives it.
    #[sqlx(rename = "webhook_id")]
    pub stored_webhook_id: String,
    /// The callback's envelope, or the action request (sealed; empty once erased).
    pub payload: Vec<u8>,
    pub retries_left: i64,
    /// A callback's endpoint's URL (none once the endpoint is deleted).
    pub callback_url: Option<String>,
    /// `callback`, or the action a connector carries out.
    pub action: String,
    /// The connector's name, for an action request.
    pub connector: Option<String>,
    /// A callback's endpoint (the nil id for an action request).
    pub endpoint_id: Uuid,
    /// The endpoint's name, which its secret is sealed under.
    pub endpoint_name: Option<String>,
    /// The endpoint's own signing secret, sealed; `None` signs with the tenant's webhook
    /// secrets.
    pub endpoint_secret: Option<Vec<u8>>,
}

impl DueDelivery {
    /// The `webhook-id` it goes out under.
    pub fn webhook_id(&self) -> String {
        read_webhook_id(
            &self.stored_webhook_id,
            self.tenant_id,
            self.event_id,
            &self.action,
            self.endpoint_id,
        )
    }
}

/// What a lease returns of a delivery: [`DueDelivery`]'s columns.
pub(crate) const DUE_COLUMNS: &str = "id, tenant_id, event_id, webhook_id, payload, \
     retries_left, action, connector, endpoint_id, \
     (SELECT url FROM endpoints e WHERE e.id = deliveries.endpoint_id) AS callback_url, \
     (SELECT name FROM endpoints e WHERE e.id = deliveries.endpoint_id) AS endpoint_name, \
     (SELECT sealed_secret FROM endpoints e WHERE e.id = deliveries.endpoint_id) \
     AS endpoint_secret";

/// What asking to redeliver found.
#[derive(Clone, Debug)]
pub enum Redelivery {
    /// Leased for an attempt now, with a fresh retry budget.
    Leased(Box<DueDelivery>),
    /// Redelivered at `last` (unix ms), too recently to be again.
    TooSoon { last: i64 },
    /// Leased by another attempt now, its endpoint disabled, or no such delivery.
    Unavailable,
}

/// One attempt and the delivery's state after it, recorded together.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    pub id: Uuid,
    pub delivery_id: Uuid,
    pub tenant_id: Uuid,
    pub attempted_at: i64,
    pub trigger: &'static str,
    pub status_code: Option<i32>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<Vec<u8>>,
    pub next: crate::domain::Next,
}

/// The stored trigger of a delivery's inline attempt, made right after the commit that stored
/// the delivery: at most one per delivery, recorded on the delivery's own row.
pub const INLINE_TRIGGER: &str = "inline";

impl AttemptRecord {
    /// Whether this is its delivery's inline attempt, recorded on the delivery row rather than
    /// as a `delivery_attempts` row.
    pub fn is_inline(&self) -> bool {
        self.trigger == INLINE_TRIGGER
    }
}

/// An attempt as read back.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AttemptRow {
    pub attempted_at: i64,
    #[sqlx(rename = "trigger_kind")]
    pub trigger: String,
    pub status_code: Option<i32>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<Vec<u8>>,
    /// A resolution's API key (the nil key for the CLI).
    pub resolved_by: Option<Uuid>,
    /// A resolution's reason.
    pub reason: Option<String>,
}

/// An operator's settling of an action request whose outcome is `unknown`.
#[derive(Clone, Debug)]
pub struct Resolution {
    pub tenant_id: Uuid,
    pub delivery_id: Uuid,
    /// `Succeeded` or `Failed`.
    pub status: DeliveryStatus,
    /// The request's `last_error` from now on.
    pub last_error: Option<String>,
    /// The attempt that records it.
    pub attempt_id: Uuid,
    pub resolved_by: Uuid,
    pub reason: String,
    pub now: i64,
}

/// What a resolution found.
#[derive(Clone, Debug)]
pub enum Resolved {
    /// Settled: the request as it now stands.
    Settled(Box<DeliveryRecord>),
    /// The delivery is not an action request whose outcome is unknown; it stands at this.
    NotUnknown(DeliveryStatus),
    /// The tenant has no such delivery.
    NotFound,
}

/// A callback delivery as read back.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct DeliveryRecord {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    /// As stored: empty where [`Self::webhook_id`] derives it.
    #[sqlx(rename = "webhook_id")]
    pub stored_webhook_id: String,
    #[sqlx(try_from = "String")]
    pub status: crate::domain::DeliveryStatus,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// `callback`, or the action a connector carries out.
    pub action: String,
    /// The connector's name, for an action request.
    pub connector: Option<String>,
    /// The endpoint's name, for a callback (none once the endpoint is deleted).
    pub endpoint: Option<String>,
    /// The endpoint's id (the nil id for an action request).
    pub endpoint_id: Uuid,
}

impl DeliveryRecord {
    /// The `webhook-id` it goes out under.
    pub fn webhook_id(&self) -> String {
        read_webhook_id(
            &self.stored_webhook_id,
            self.tenant_id,
            self.event_id,
            &self.action,
            self.endpoint_id,
        )
    }
}

/// The outbox.
#[async_trait]
pub trait DeliveryStore {
    /// The deliveries of one of the tenant's events.
    async fn deliveries_for_event(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Leases up to `limit` deliveries due at `now`, and not attempted (nor otherwise updated)
    /// at or after `since`, until `lease_until`, none of the tenants in `skip`; no two callers
    /// get the same delivery.
    async fn lease_due(
        &self,
        now: i64,
        since: i64,
        lease_until: i64,
        limit: i64,
        skip: &[Uuid],
    ) -> Result<Vec<DueDelivery>, StoreError>;
    /// Records an attempt and moves the delivery to its next state, in one transaction (and
    /// disables the tenant's endpoint after a 410).
    async fn record_attempt(&self, attempt: &AttemptRecord) -> Result<(), StoreError>;
    /// Gives one of the tenant's deliveries a fresh retry budget and leases it, unless it is
    /// leased now, the endpoint is disabled, or it was redelivered after `redelivered_since`
    /// (the rate limit, judged from the attempts recorded, so it holds across instances).
    async fn lease_for_redelivery(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        now: i64,
        lease_until: i64,
        retries: i64,
        redelivered_since: i64,
    ) -> Result<Redelivery, StoreError>;
    /// The tenant's deliveries, newest first, optionally of one status and of one endpoint's.
    async fn deliveries(
        &self,
        tenant_id: Uuid,
        status: Option<crate::domain::DeliveryStatus>,
        endpoint: Option<&crate::domain::EndpointName>,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// One of the tenant's deliveries.
    async fn delivery(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<DeliveryRecord>, StoreError>;
    /// One of the tenant's deliveries with its attempts (oldest first), read in one snapshot:
    /// an attempt is committed together with its delivery's new state, and two separate reads
    /// could see the one without the other.
    async fn delivery_with_attempts(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<(DeliveryRecord, Vec<AttemptRow>)>, StoreError>;
    /// Deliveries waiting for an attempt.
    async fn queue_depth(&self, now: i64) -> Result<i64, StoreError>;
    /// When the worker should next look (unix ms), if ever: when the earliest queued delivery
    /// with retries left is due (a walk of the queue in due order that stops at the first such
    /// row), or the earliest lease not yet swept ends, whichever is sooner.
    async fn next_due(&self) -> Result<Option<i64>, StoreError>;
    /// Queues the pending deliveries whose lease ran out since the last sweep and by `now`
    /// (unix ms): a delivery made under a lease is queued only then, when its holder (an
    /// inline attempt, a connector call) died before settling it. Returns how many it queued.
    async fn queue_lapsed_leases(&self, now: i64) -> Result<u64, StoreError>;
    /// Leases the pending action requests of one of the tenant's events until `lease_until`:
    /// all of them or none, none while any is leased to another call or waits for the time
    /// its schedule or its connector's `Retry-After` put it off to (`next_attempt_at`).
    async fn lease_requests(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
        now: i64,
        lease_until: i64,
    ) -> Result<Vec<DueDelivery>, StoreError>;
    /// Marks an action request sent (at `now`, unix ms), durably, before a call to an
    /// at-most-once connector; returns whether this marked it. `false`: a call was sent before
    /// and no attempt has been recorded since (the mark is cleared with each record), so that
    /// call may have acted and this one must not be made.
    async fn mark_sent(&self, id: Uuid, now: i64) -> Result<bool, StoreError>;
    /// Settles an action request whose outcome is `unknown` as an operator says, with an
    /// attempt of trigger `resolve` recording who and why, in one transaction (a
    /// compare-and-set on the status, so two resolutions cannot both settle it).
    async fn resolve(&self, resolution: &Resolution) -> Result<Resolved, StoreError>;
    /// Where each action request of one of the tenant's events stands, with its last error.
    async fn request_statuses(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
    ) -> Result<Vec<(ActionKind, DeliveryStatus, Option<String>)>, StoreError>;
}

/// How long before the last sweep's mark a delivery still pending under the lease it was made
/// with may have been made: longer than any such lease (`delivery::LEASE`), with a minute to
/// spare for instances' clocks, which make the ids.
pub(crate) const UNSWEPT_SPAN_MS: i64 = 3 * 60 * 1000;

/// Where a listing of the tenant's deliveries in `status` (`$2`) finds them, and the condition
/// that picks them: no index of `deliveries` names the status (postgres/0033), so the pending
/// ones are found from the tenant's queue rows (few, but possibly older than every settled one
/// since) and, for those under the lease they were made with and not queued, among the
/// tenant's made since `$6`; those that need a look by `troubled_status`; and the succeeded
/// ones, nearly all, in the tenant's index by id. (`$6` is the nil id, before every other, for
/// the other statuses.) `CROSS JOIN` keeps SQLite from reading the tenant's index first.
fn listed_in(status: Option<DeliveryStatus>) -> (&'static str, &'static str) {
    match status {
        None => ("deliveries", "$2 = '' AND id >= $6"),
        Some(DeliveryStatus::Succeeded) => ("deliveries", "status = $2 AND id >= $6"),
        Some(DeliveryStatus::Pending) => (
            "(SELECT id AS listed FROM delivery_queue WHERE tenant_id = $1 AND id < $3 \
             UNION SELECT id FROM deliveries \
             WHERE tenant_id = $1 AND id >= $6 AND id < $3 AND status = 'pending') q \
             CROSS JOIN deliveries",
            "id = q.listed AND status = $2",
        ),
        Some(
            DeliveryStatus::Failed
            | DeliveryStatus::Dead
            | DeliveryStatus::Unknown
            | DeliveryStatus::Suspended,
        ) => ("deliveries", "troubled_status = $2 AND id >= $6"),
    }
}

/// How many milliseconds of lease ends one statement of [`DeliveryStore::queue_lapsed_leases`]
/// sweeps.
const SWEEP_STRETCH_MS: i64 = 10 * 60 * 1000;

/// The columns of [`DeliveryRecord`].
pub(crate) const DELIVERY_COLUMNS: &str = "id, tenant_id, event_id, webhook_id, status, \
     attempts, next_attempt_at, last_error, created_at, updated_at, action, connector, endpoint_id, \
     (SELECT name FROM endpoints e WHERE e.id = deliveries.endpoint_id) AS endpoint";
/// One of a tenant's deliveries by id (`$1` tenant, `$2` id).
fn delivery_by_id() -> String {
    format!(
        "SELECT {} FROM deliveries WHERE tenant_id = $1 AND id = $2",
        crate::store::deliveries::DELIVERY_COLUMNS
    )
}
#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> DeliveryStore for B
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
    async fn deliveries_for_event(
        &self,
        tenant_id: uuid::Uuid,
        event_id: uuid::Uuid,
    ) -> Result<Vec<crate::store::DeliveryRecord>, crate::store::StoreError> {
        let sql = format!(
            "SELECT {} FROM deliveries WHERE tenant_id = $1 AND event_id = $2 \
             ORDER BY action <> 'callback', id",
            crate::store::deliveries::DELIVERY_COLUMNS
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(event_id)
            .fetch_all(self.read())
            .await?)
    }

    async fn lease_due(
        &self,
        now: i64,
        since: i64,
        lease_until: i64,
        limit: i64,
        skip: &[uuid::Uuid],
    ) -> Result<Vec<crate::store::DueDelivery>, crate::store::StoreError> {
        // The tenants to skip as a JSON array of UUID strings: one parameter, whatever
        // their number, that both databases can read as a set.
        let skip = serde_json::to_string(skip)
            .map_err(|e| crate::store::StoreError::Corrupt(Box::new(e)))?;
        let due = sqlx::query_as(B::lease_due())
            .bind(now)
            .bind(lease_until)
            .bind(limit)
            .bind(since)
            .bind(skip)
            .fetch_all(self.write())
            .await?;
        with_envelopes(self.write(), due).await
    }

    async fn record_attempt(
        &self,
        a: &crate::store::AttemptRecord,
    ) -> Result<(), crate::store::StoreError> {
        let mut tx = self.begin().await?;
        record_attempts(&mut *tx, &[a]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn lease_for_redelivery(
        &self,
        tenant_id: uuid::Uuid,
        id: uuid::Uuid,
        now: i64,
        lease_until: i64,
        retries: i64,
        redelivered_since: i64,
    ) -> Result<crate::store::deliveries::Redelivery, crate::store::StoreError> {
        use crate::store::deliveries::Redelivery;
        // The lease and the attempt's record are one compare-and-set each, and the
        // attempt row is written in the transaction that ends the lease, so a second
        // request sees either the lease or the attempt. Only a pending delivery is leased:
        // a settled one may still show the end of the inline attempt's lease that settled
        // it (postgres/0033).
        let sql = format!(
            "UPDATE deliveries SET status = 'pending', retries_left = $5, \
             next_attempt_at = $3, leased_until = $4, updated_at = $3 \
             WHERE tenant_id = $1 AND id = $2 AND (status <> 'pending' OR leased_until <= $3) \
             AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = deliveries.endpoint_id \
                AND e.disabled) \
             AND (action = 'callback' OR length(payload) > 0) \
             AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.delivery_id = deliveries.id \
             AND a.trigger_kind = 'redeliver' AND a.attempted_at > $6) \
             RETURNING {}",
            crate::store::deliveries::DUE_COLUMNS
        );
        let row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(id)
            .bind(now)
            .bind(lease_until)
            .bind(retries)
            .bind(redelivered_since)
            .fetch_optional(self.write())
            .await?;
        if let Some(due) = row {
            let mut due = with_envelopes(self.write(), vec![due]).await?;
            if let Some(due) = due.pop() {
                return Ok(Redelivery::Leased(Box::new(due)));
            }
        }
        let last: Option<i64> = sqlx::query_scalar(
            "SELECT MAX(a.attempted_at) FROM delivery_attempts a \
             JOIN deliveries d ON d.id = a.delivery_id \
             WHERE d.tenant_id = $1 AND d.id = $2 AND a.trigger_kind = 'redeliver'",
        )
        .bind(tenant_id)
        .bind(id)
        .fetch_one(self.write())
        .await?;
        Ok(match last {
            Some(last) if last > redelivered_since => Redelivery::TooSoon { last },
            _ => Redelivery::Unavailable,
        })
    }

    async fn deliveries(
        &self,
        tenant_id: uuid::Uuid,
        status: Option<crate::domain::DeliveryStatus>,
        endpoint: Option<&crate::domain::EndpointName>,
        before: Option<uuid::Uuid>,
        limit: i64,
    ) -> Result<Vec<crate::store::DeliveryRecord>, crate::store::StoreError> {
        // A nil UUID cursor sorts before every v7 id, so "no cursor" is the max UUID.
        let cursor = before.unwrap_or(uuid::Uuid::max());
        let (from, listed) = listed_in(status);
        // The pending ones not queued are under the lease they were made with, so made since
        // a little before the last sweep: ids from then on (UUIDv7, the time first).
        let made_since = if status == Some(DeliveryStatus::Pending) {
            let swept_to: i64 = sqlx::query_scalar("SELECT swept_to FROM delivery_sweep")
                .fetch_one(self.read())
                .await?;
            let since = swept_to.saturating_sub(UNSWEPT_SPAN_MS).max(0);
            Uuid::from_u128(u128::from(since.unsigned_abs()) << 80)
        } else {
            Uuid::nil()
        };
        let sql = format!(
            "SELECT {} FROM {from} WHERE tenant_id = $1 AND {listed} AND id < $3 \
             AND ($5 = '' OR endpoint_id = (SELECT e.id FROM endpoints e \
                WHERE e.tenant_id = $1 AND e.name = $5)) \
             ORDER BY id DESC LIMIT $4",
            crate::store::deliveries::DELIVERY_COLUMNS
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(status.map_or("", |s| s.as_str()))
            .bind(cursor)
            .bind(limit)
            .bind(endpoint.map_or("", |e| e.as_str()))
            .bind(made_since)
            .fetch_all(self.read())
            .await?)
    }

    async fn delivery(
        &self,
        tenant_id: uuid::Uuid,
        id: uuid::Uuid,
    ) -> Result<Option<crate::store::DeliveryRecord>, crate::store::StoreError> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(delivery_by_id()))
            .bind(tenant_id)
            .bind(id)
            .fetch_optional(self.read())
            .await?)
    }

    async fn delivery_with_attempts(
        &self,
        tenant_id: uuid::Uuid,
        id: uuid::Uuid,
    ) -> Result<
        Option<(crate::store::DeliveryRecord, Vec<crate::store::AttemptRow>)>,
        crate::store::StoreError,
    > {
        let mut tx = self.read().begin_with(B::READ_SNAPSHOT).await?;
        let delivery: Option<crate::store::DeliveryRecord> =
            sqlx::query_as(sqlx::AssertSqlSafe(delivery_by_id()))
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(delivery) = delivery else {
            return Ok(None);
        };
        let rows = sqlx::query(ATTEMPTS_OF)
            .bind(id)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some((delivery, attempt_rows::<DB>(&rows)?)))
    }

    async fn queue_depth(&self, now: i64) -> Result<i64, crate::store::StoreError> {
        let _ = now;
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM delivery_queue")
            .fetch_one(self.read())
            .await?)
    }

    async fn queue_lapsed_leases(&self, now: i64) -> Result<u64, StoreError> {
        let mut from: i64 = sqlx::query_scalar("SELECT swept_to FROM delivery_sweep")
            .fetch_one(self.write())
            .await?;
        let mut queued = 0;
        // The rows read are locked against a concurrent update (a retry's record, a
        // redelivery, a way back) and read at their latest, so that none is queued at a due
        // time its trigger has just moved it from.
        let sweep = format!(
            "INSERT INTO delivery_queue (next_attempt_at, id, tenant_id) \
             SELECT next_attempt_at, id, tenant_id FROM deliveries \
             WHERE leased_until > $1 AND leased_until <= $2 AND status = 'pending'{} \
             ON CONFLICT DO NOTHING",
            DB::SHARE_ROWS
        );
        // A stretch of lease ends per statement, so that the first sweep after a long stop
        // runs as several bounded ones. Sweepers that overlap queue nothing twice, and the
        // mark only moves forward. Each stretch is swept again [`UNSWEPT_SPAN_MS`] later, for
        // a delivery whose insert committed after its lease ended or whose instance's clock
        // runs behind the sweeper's.
        while from < now {
            let to = now.min(from.saturating_add(SWEEP_STRETCH_MS));
            for (after, until) in [(from, to), (from - UNSWEPT_SPAN_MS, to - UNSWEPT_SPAN_MS)] {
                let done = sqlx::query(sqlx::AssertSqlSafe(sweep.as_str()))
                    .bind(after)
                    .bind(until)
                    .execute(self.write())
                    .await?;
                queued += DB::rows_affected(&done);
            }
            sqlx::query("UPDATE delivery_sweep SET swept_to = $1 WHERE swept_to < $1")
                .bind(to)
                .execute(self.write())
                .await?;
            from = to;
        }
        Ok(queued)
    }

    async fn next_due(&self) -> Result<Option<i64>, crate::store::StoreError> {
        let queued: Option<i64> = sqlx::query_scalar(
            "SELECT q.next_attempt_at FROM delivery_queue q WHERE EXISTS \
             (SELECT 1 FROM deliveries d WHERE d.id = q.id AND d.retries_left > 0 \
                AND d.status = 'pending' AND d.next_attempt_at = q.next_attempt_at) \
             ORDER BY q.next_attempt_at LIMIT 1",
        )
        .fetch_optional(self.read())
        .await?;
        // The first lease not swept yet may end with its delivery still pending.
        let lease_end: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(leased_until) FROM deliveries \
             WHERE leased_until > (SELECT swept_to FROM delivery_sweep)",
        )
        .fetch_one(self.read())
        .await?;
        Ok(queued.into_iter().chain(lease_end).min())
    }

    async fn lease_requests(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
        now: i64,
        lease_until: i64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        // One statement, so that no request is leased (and then left uncalled) when another
        // is not to be called yet.
        let sql = format!(
            "UPDATE deliveries SET leased_until = $4 \
             WHERE tenant_id = $1 AND event_id = $2 AND action <> 'callback' \
             AND status = 'pending' AND leased_until <= $3 AND next_attempt_at <= $3 \
             AND NOT EXISTS (SELECT 1 FROM deliveries later WHERE later.tenant_id = $1 \
                AND later.event_id = $2 AND later.action <> 'callback' \
                AND later.status = 'pending' \
                AND (later.leased_until > $3 OR later.next_attempt_at > $3)) \
             RETURNING {DUE_COLUMNS}"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(event_id)
            .bind(now)
            .bind(lease_until)
            .fetch_all(self.write())
            .await?)
    }

    async fn mark_sent(&self, id: Uuid, now: i64) -> Result<bool, StoreError> {
        let done =
            sqlx::query("UPDATE deliveries SET sent_at = $2 WHERE id = $1 AND sent_at IS NULL")
                .bind(id)
                .bind(now)
                .execute(self.write())
                .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn resolve(&self, r: &Resolution) -> Result<Resolved, StoreError> {
        let mut tx = self.begin().await?;
        let sql = format!(
            "UPDATE deliveries SET status = $3, last_error = $4, updated_at = $5, \
             leased_until = 0, sent_at = NULL \
             WHERE tenant_id = $1 AND id = $2 AND status = 'unknown' AND action <> 'callback' \
             RETURNING {DELIVERY_COLUMNS}"
        );
        let settled: Option<DeliveryRecord> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(r.tenant_id)
            .bind(r.delivery_id)
            .bind(r.status.as_str())
            .bind(r.last_error.as_deref())
            .bind(r.now)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(settled) = settled else {
            drop(tx);
            return Ok(match self.delivery(r.tenant_id, r.delivery_id).await? {
                Some(d) => Resolved::NotUnknown(d.status),
                None => Resolved::NotFound,
            });
        };
        sqlx::query(
            "INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, \
             status_code, latency_ms, error, response_excerpt, resolved_by, reason) \
             VALUES ($1, $2, $3, 'resolve', NULL, 0, $4, NULL, $5, $6)",
        )
        .bind(r.attempt_id)
        .bind(r.delivery_id)
        .bind(r.now)
        .bind(r.last_error.as_deref())
        .bind(r.resolved_by)
        .bind(r.reason.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Resolved::Settled(Box::new(settled)))
    }

    async fn request_statuses(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
    ) -> Result<Vec<(ActionKind, DeliveryStatus, Option<String>)>, StoreError> {
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
            "SELECT action, status, last_error FROM deliveries \
             WHERE tenant_id = $1 AND event_id = $2 AND action <> 'callback'",
        )
        .bind(tenant_id)
        .bind(event_id)
        .fetch_all(self.read())
        .await?;
        rows.into_iter()
            .map(|(action, status, error)| {
                let corrupt = |e: Box<dyn std::error::Error + Send + Sync>| StoreError::Corrupt(e);
                Ok((
                    action.parse().map_err(|e| corrupt(Box::new(e)))?,
                    status.parse().map_err(|e| corrupt(Box::new(e)))?,
                    error,
                ))
            })
            .collect()
    }
}
