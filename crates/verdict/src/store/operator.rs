//! The way back: an operator's undoing of a rule's effect on a subject (unlock, lift a deny,
//! close a case), recorded as an event with its connector request, in one transaction.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, QueryBuilder, Type};
use uuid::Uuid;

use super::backend::{Backend, SqlDb};
use super::rows::{RequestRow, push_values};
use super::{ActionTarget, NewEvent, RequestDraft, StoreError};
use crate::domain::ActionKind;

/// An operator's undoing of one effect on one subject.
#[derive(Clone, Debug)]
pub struct Undo {
    /// `UnlockAccount`, `LiftDeny` or `CloseCase`.
    pub action: ActionKind,
    pub target: ActionTarget,
    /// The event that records it, stored only if there was something to undo.
    pub event: NewEvent,
    /// The request to the connector the undone action is bound to, if any.
    pub request: Option<RequestDraft>,
}

/// Operators' undoing of effects.
#[async_trait]
pub trait OperatorStore {
    /// Undoes the effect, and if there was one to undo, stores its event and connector request;
    /// returns whether there was. A repeat finds nothing to undo and stores nothing.
    async fn undo(&self, undo: &Undo) -> Result<bool, StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> OperatorStore for B
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
    async fn undo(&self, undo: &Undo) -> Result<bool, StoreError> {
        let statement = match undo.action {
            ActionKind::UnlockAccount => {
                "DELETE FROM account_locks WHERE tenant_id = $1 AND subject_hash = $2"
            }
            ActionKind::LiftDeny => "DELETE FROM denies WHERE tenant_id = $1 AND subject_hash = $2",
            ActionKind::CloseCase => {
                "UPDATE cases SET status = 'closed' \
                 WHERE tenant_id = $1 AND subject_hash = $2 AND status = 'open'"
            }
            other => {
                return Err(StoreError::Corrupt(
                    format!("`{}` undoes nothing", other.as_str()).into(),
                ));
            }
        };
        let mut tx = self.begin().await?;
        let done = sqlx::query(statement)
            .bind(undo.target.tenant_id)
            .bind(&undo.target.subject_hash[..])
            .execute(&mut *tx)
            .await?;
        if DB::rows_affected(&done) == 0 {
            return Ok(false);
        }
        // A call of the undone action still waiting for a retry would undo the undoing: it is
        // failed here (one in flight now cannot be stopped; it ends before its lease does).
        if let Some(undone) = undo.action.undoes() {
            sqlx::query(
                "UPDATE deliveries SET status = 'failed', \
                 last_error = 'superseded by an operator''s way back', \
                 payload = substr(payload, 1, 0), updated_at = $4 \
                 WHERE tenant_id = $1 AND action = $3 AND status = 'pending' \
                 AND leased_until <= $4 AND event_id IN \
                 (SELECT id FROM events WHERE tenant_id = $1 AND subject_hash = $2)",
            )
            .bind(undo.target.tenant_id)
            .bind(&undo.target.subject_hash[..])
            .bind(undone.as_str())
            .bind(undo.target.now)
            .execute(&mut *tx)
            .await?;
        }
        let mut q = QueryBuilder::<DB>::new("INSERT INTO events ");
        push_values(&mut q, &[&undo.event]);
        q.build().execute(&mut *tx).await?;
        if let Some(request) = &undo.request {
            let row = RequestRow {
                target: &undo.target,
                request,
            };
            let mut q = QueryBuilder::<DB>::new("INSERT INTO deliveries ");
            push_values(&mut q, &[&row]);
            q.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}
