//! The way back: an operator's undoing of a rule's effect on a subject (unlock, lift a deny,
//! close a case), recorded as an event with its connector request, in one transaction; with an
//! `Idempotency-Key`, the key's row moves on in that same transaction.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, QueryBuilder, Type};
use uuid::Uuid;

use super::backend::{Backend, SqlDb};
use super::rows::{RequestRow, push_values};
use super::{ActionTarget, HeldKey, NewEvent, RequestDraft, StoreError, StoredResponse};
use crate::domain::{ActionKind, KeyState};

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
    /// The `Idempotency-Key` this request holds, if it has one.
    pub keyed: Option<KeyedUndo>,
}

/// What a keyed way back stores on its key, in the undo's own transaction.
#[derive(Clone, Debug)]
pub struct KeyedUndo {
    pub held: HeldKey,
    /// If there was something to undo: the final response (the key `completed`) when no
    /// connector is called, else the response with the call `pending` (the key `dispatched`,
    /// still held, until the call's outcome completes it).
    pub undone: StoredResponse,
    /// If there was nothing to undo: the final response (the key `completed`).
    pub nothing: StoredResponse,
}

/// Operators' undoing of effects.
#[async_trait]
pub trait OperatorStore {
    /// Undoes the effect, and if there was one to undo, stores its event and connector request;
    /// returns whether there was. A repeat finds nothing to undo and stores nothing. A keyed
    /// undo moves its key on in the same transaction, or fails with
    /// [`StoreError::LockLost`] (storing nothing) if the key is no longer its to move.
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
                "UPDATE subjects SET locked_by = NULL, locked_at = NULL \
                 WHERE tenant_id = $1 AND subject_hash = $2 AND locked_by IS NOT NULL"
            }
            ActionKind::LiftDeny => {
                "UPDATE subjects SET denied_by = NULL, denied_at = NULL \
                 WHERE tenant_id = $1 AND subject_hash = $2 AND denied_by IS NOT NULL"
            }
            ActionKind::CloseCase => {
                "UPDATE cases SET status = 'closed' WHERE status = 'open' AND id = \
                 (SELECT open_case FROM subjects WHERE tenant_id = $1 AND subject_hash = $2)"
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
            if let Some(keyed) = &undo.keyed {
                settle_key(&mut tx, &keyed.held, &keyed.nothing, KeyState::Completed).await?;
                tx.commit().await?;
            }
            return Ok(false);
        }
        // The subject's row forgets the case closed (a lock or deny lifted was cleared by the
        // statement above), and goes when nothing is left on it.
        if undo.action == ActionKind::CloseCase {
            sqlx::query(
                "UPDATE subjects SET open_case = NULL WHERE tenant_id = $1 AND subject_hash = $2",
            )
            .bind(undo.target.tenant_id)
            .bind(&undo.target.subject_hash[..])
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "DELETE FROM subjects WHERE tenant_id = $1 AND subject_hash = $2 \
             AND locked_by IS NULL AND denied_by IS NULL AND open_case IS NULL",
        )
        .bind(undo.target.tenant_id)
        .bind(&undo.target.subject_hash[..])
        .execute(&mut *tx)
        .await?;
        // A call of the undone action still waiting for a retry would undo the undoing: it is
        // failed here (one in flight now cannot be stopped; it ends before its lease does), or
        // `unknown` if an at-most-once call was sent and may have acted.
        if let Some(undone) = undo.action.undoes() {
            let superseded = format!(
                "UPDATE deliveries SET \
                 status = CASE WHEN sent_at IS NULL THEN 'failed' ELSE 'unknown' END, \
                 last_error = CASE WHEN sent_at IS NULL \
                 THEN 'superseded by an operator''s way back' \
                 ELSE 'superseded by an operator''s way back after a call that may have acted' \
                 END, \
                 payload = substr(payload, 1, 0), updated_at = $4 \
                 WHERE tenant_id = $1 AND action = $3 AND status = 'pending' \
                 AND leased_until <= $4 AND event_id IN ({})",
                DB::SUBJECT_EVENT_IDS
            );
            sqlx::query(sqlx::AssertSqlSafe(superseded))
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
        if let Some(keyed) = &undo.keyed {
            let state = if undo.request.is_some() {
                KeyState::Dispatched
            } else {
                KeyState::Completed
            };
            settle_key(&mut tx, &keyed.held, &keyed.undone, state).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// Moves a held key from `in_flight` to `state` with `response` (a completed key's lock is
/// released; a dispatched one's is kept for the call); [`StoreError::LockLost`] if it is no
/// longer held by this request or no longer in flight.
async fn settle_key<DB: SqlDb>(
    tx: &mut sqlx::Transaction<'static, DB>,
    held: &HeldKey,
    response: &StoredResponse,
    state: KeyState,
) -> Result<(), StoreError>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    let release = if state == KeyState::Completed {
        ", lock_token = NULL, locked_until = 0"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE idempotency_keys SET state = $5, response_status = $6, response_body = $7{release} \
         WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 AND lock_token = $4 \
         AND state = 'in_flight'"
    );
    let done = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(held.key.tenant_id)
        .bind(held.key.endpoint)
        .bind(&held.key.digest[..])
        .bind(held.lock_token)
        .bind(state.as_str())
        .bind(i32::from(response.status))
        .bind(&response.body[..])
        .execute(&mut **tx)
        .await?;
    if DB::rows_affected(&done) != 1 {
        return Err(StoreError::LockLost);
    }
    Ok(())
}
