//! The idempotent actions' tables (locks, cases, alert windows, step-up ledger, denies): each has a
//! natural key that makes a repeated action a no-op, and records the event that applied it, so a
//! retry of the same event reads "done" and a duplicate signal reads "already done".
//!
//! The statements apply one action for a whole batch of signals at once (the group commit's
//! multi-row statements); a conflict in one row never fails the others.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};

/// Who an action is about and which event applies it.
#[derive(Clone, Debug)]
pub struct ActionTarget {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    pub subject_hash: Vec<u8>,
    /// Digest of (subject, type, observed_at): the same signal under any key or none.
    pub signal_key: Vec<u8>,
    /// When the signal was observed (unix ms), which its key digests: a delivery's and a ledger
    /// entry's uniqueness lead with it, so those indexes are written in time order rather than
    /// at random.
    pub observed_at: i64,
    pub signal_type: &'static str,
    pub now: i64,
}

/// What currently stands against a subject.
#[derive(Clone, Debug, Default)]
pub struct SubjectState {
    /// The event that locked the account, and when.
    pub lock: Option<(Uuid, i64)>,
    /// Open cases: id, opening time, attached events.
    pub open_cases: Vec<(Uuid, i64, Vec<Uuid>)>,
    /// The event that issued the standing deny, and when.
    pub deny: Option<(Uuid, i64)>,
    /// Its 50 newest events, newest first.
    pub events: Vec<Uuid>,
}

/// Of a subject's `subjects` row: the lock's event and time, the deny's event and time.
type HoldsRow = (Option<Uuid>, Option<i64>, Option<Uuid>, Option<i64>);

/// A hold on a subject: the event that applied it, and when.
type Hold = Option<(Uuid, i64)>;

/// The lock and the deny of a subject's row (a pair of columns is set whole or not at all).
fn held((locked_by, locked_at, denied_by, denied_at): HoldsRow) -> (Hold, Hold) {
    (locked_by.zip(locked_at), denied_by.zip(denied_at))
}

/// Reads of the actions' state.
#[async_trait]
pub trait ActionStore {
    /// Locks, open cases and the standing deny of a subject; `None` if the tenant has no event
    /// about it.
    async fn subject(
        &self,
        tenant_id: Uuid,
        subject_hash: &[u8],
    ) -> Result<Option<SubjectState>, StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> ActionStore for B
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
    async fn subject(
        &self,
        tenant_id: uuid::Uuid,
        subject_hash: &[u8],
    ) -> Result<Option<crate::store::SubjectState>, crate::store::StoreError> {
        let latest = format!(
            "SELECT id FROM ({}) s ORDER BY id DESC LIMIT 50",
            DB::SUBJECT_EVENT_IDS
        );
        let events: Vec<uuid::Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(latest))
            .bind(tenant_id)
            .bind(subject_hash)
            .fetch_all(self.read())
            .await?;
        if events.is_empty() {
            return Ok(None);
        }
        let holds: Option<HoldsRow> = sqlx::query_as(
            "SELECT locked_by, locked_at, denied_by, denied_at FROM subjects \
             WHERE tenant_id = $1 AND subject_hash = $2",
        )
        .bind(tenant_id)
        .bind(subject_hash)
        .fetch_optional(self.read())
        .await?;
        let (lock, deny) = holds.map(held).unwrap_or_default();
        let rows: Vec<(uuid::Uuid, i64, uuid::Uuid)> = sqlx::query_as(
            "SELECT c.id, c.opened_at, c.opened_by_event FROM subjects s \
             JOIN cases c ON c.id = s.open_case \
             WHERE s.tenant_id = $1 AND s.subject_hash = $2 \
             UNION ALL SELECT c.id, c.opened_at, e.event_id FROM subjects s \
             JOIN cases c ON c.id = s.open_case JOIN case_events e ON e.case_id = c.id \
             WHERE s.tenant_id = $1 AND s.subject_hash = $2 \
             ORDER BY 1, 3",
        )
        .bind(tenant_id)
        .bind(subject_hash)
        .fetch_all(self.read())
        .await?;
        let mut open_cases: Vec<(uuid::Uuid, i64, Vec<uuid::Uuid>)> = Vec::new();
        for (id, opened_at, event) in rows {
            match open_cases.last_mut() {
                Some(case) if case.0 == id => case.2.push(event),
                _ => open_cases.push((id, opened_at, vec![event])),
            }
        }
        Ok(Some(crate::store::SubjectState {
            lock,
            open_cases,
            deny,
            events,
        }))
    }
}
