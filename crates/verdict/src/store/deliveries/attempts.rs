//! Recording attempts: each attempt's row, its delivery's next state, and the endpoints a 410
//! disables, written together; and reading a delivery's attempts back.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use crate::store::backend::{SqlDb, execute_pushed};

/// Records attempts and moves each delivery to its next state (and disables the
/// endpoints that answered 410), in at most three statements whatever the number: one
/// query on SQLite (one hop to its connection thread), one query each on PostgreSQL,
/// which prepares one statement per query.
pub(crate) async fn record_attempts<DB, C>(
    conn: &mut C,
    attempts: &[&crate::store::AttemptRecord],
) -> Result<(), sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
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
    run_attempt_steps(conn, &record_steps::<DB>(), attempts).await
}

/// The statements that record attempts, in order; each pushes nothing when it has nothing to
/// do.
fn record_steps<DB: SqlDb>() -> [AttemptStep<DB>; 3]
where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    [
        push_insert_attempts,
        push_advance_deliveries,
        push_disable_endpoints,
    ]
}

/// Adds to `q` every statement of [`record_attempts`] (none if there are no attempts), for a
/// backend that runs several statements in one query.
pub(crate) fn push_record_attempts<DB: SqlDb>(
    q: &mut sqlx::QueryBuilder<DB>,
    attempts: &[&crate::store::AttemptRecord],
) where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    for push in record_steps::<DB>() {
        push(q, attempts);
    }
}

/// Disables the callback endpoints that answered an attempt with 410.
pub(crate) async fn disable_endpoints<DB, C>(
    conn: &mut C,
    attempts: &[&crate::store::AttemptRecord],
) -> Result<(), sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
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
    run_attempt_steps(conn, &[push_disable_endpoints], attempts).await
}

/// A statement that records attempts, pushed onto a query.
type AttemptStep<DB> = fn(&mut sqlx::QueryBuilder<DB>, &[&crate::store::AttemptRecord]);

/// Runs `steps` for `attempts`: together on a backend that runs several statements in
/// one query, one query each otherwise.
async fn run_attempt_steps<DB, C>(
    conn: &mut C,
    steps: &[AttemptStep<DB>],
    attempts: &[&crate::store::AttemptRecord],
) -> Result<(), sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
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
    let mut q = sqlx::QueryBuilder::<DB>::new("");
    for push in steps {
        push(&mut q, attempts);
        if !DB::MULTI_STATEMENT {
            execute_pushed(&mut *conn, &mut q).await?;
        }
    }
    execute_pushed(conn, &mut q).await
}

/// Adds to `q` the statement that inserts the attempts (none if there are none).
fn push_insert_attempts<DB: SqlDb>(
    q: &mut sqlx::QueryBuilder<DB>,
    attempts: &[&crate::store::AttemptRecord],
) where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    let rows: Vec<_> = attempts.iter().filter(|a| !a.is_inline()).collect();
    if rows.is_empty() {
        return;
    }
    q.push(
        "INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, \
         status_code, latency_ms, error, response_excerpt) ",
    );
    q.push_values(rows, |mut row, a| {
        row.push_bind(a.id)
            .push_bind(a.delivery_id)
            .push_bind(a.attempted_at)
            .push_bind(a.trigger)
            .push_bind(a.status_code)
            .push_bind(a.latency_ms)
            .push_bind(a.error.clone())
            .push_bind(a.response_excerpt.clone());
    });
    q.push("; ");
}

/// Adds to `q` the statement that moves each attempt's delivery to its next state
/// (none if there are no attempts).
fn push_advance_deliveries<DB: SqlDb>(
    q: &mut sqlx::QueryBuilder<DB>,
    attempts: &[&crate::store::AttemptRecord],
) where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    if attempts.is_empty() {
        return;
    }
    // An inline attempt is recorded here, once: a record sent again after its commit's answer
    // was lost finds it there and moves nothing. One that settled its delivery keeps its
    // lease's end, so that no indexed column changes (postgres/0033).
    q.push(
        "UPDATE deliveries SET status = v.column2, attempts = attempts + 1, \
         retries_left = v.column3, next_attempt_at = v.column4, leased_until = CASE \
         WHEN v.column7 AND v.column2 <> 'pending' THEN leased_until ELSE 0 END, sent_at = NULL, \
         last_error = v.column5, updated_at = v.column6, payload = CASE \
         WHEN action <> 'callback' AND v.column2 IN ('succeeded', 'failed', 'unknown') \
         THEN substr(payload, 1, 0) \
         ELSE payload END, \
         inline_attempted_at = CASE WHEN v.column7 THEN v.column6 ELSE inline_attempted_at END, \
         inline_status_code = CASE WHEN v.column7 THEN v.column8 ELSE inline_status_code END, \
         inline_latency_ms = CASE WHEN v.column7 THEN v.column9 ELSE inline_latency_ms END, \
         inline_error = CASE WHEN v.column7 THEN v.column5 ELSE inline_error END, \
         inline_excerpt = CASE WHEN v.column7 THEN v.column10 ELSE inline_excerpt END FROM (",
    );
    q.push_values(attempts, |mut row, a| {
        row.push_bind(a.delivery_id)
            .push_bind(a.next.status.as_str())
            .push_bind(a.next.retries_left)
            .push_bind(a.next.next_attempt_at)
            .push_bind(a.error.clone())
            .push_bind(a.attempted_at)
            .push_bind(a.is_inline())
            .push_bind(a.status_code)
            .push_bind(a.latency_ms)
            .push_bind(a.response_excerpt.clone());
    });
    q.push(
        ") AS v WHERE deliveries.id = v.column1 \
         AND NOT (v.column7 AND deliveries.inline_attempted_at IS NOT NULL); ",
    );
}

/// Adds to `q` the statement that disables the callback endpoints that answered an
/// attempt with 410 (none if none did).
fn push_disable_endpoints<DB: SqlDb>(
    q: &mut sqlx::QueryBuilder<DB>,
    attempts: &[&crate::store::AttemptRecord],
) where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
{
    let gone: Vec<uuid::Uuid> = attempts
        .iter()
        .filter(|a| a.next.disable_endpoint)
        .map(|a| a.delivery_id)
        .collect();
    if gone.is_empty() {
        return;
    }
    // The endpoint each delivery went to (a callback's: only callbacks disable endpoints).
    q.push(
        "UPDATE endpoints SET disabled = TRUE WHERE id IN \
         (SELECT endpoint_id FROM deliveries WHERE id IN (",
    );
    let mut list = q.separated(", ");
    for delivery in gone {
        list.push_bind(delivery);
    }
    q.push(")); ");
}
/// A delivery's attempts, oldest first (`$1` the delivery): its inline one, recorded on its
/// row, and its rows.
pub(super) const ATTEMPTS_OF: &str = "SELECT attempted_at, trigger_kind, status_code, latency_ms, \
    error, response_excerpt, resolved_by, reason FROM ( \
    SELECT inline_attempted_at AS attempted_at, 'inline' AS trigger_kind, \
        inline_status_code AS status_code, inline_latency_ms AS latency_ms, \
        inline_error AS error, inline_excerpt AS response_excerpt, NULL AS resolved_by, \
        NULL AS reason, 0 AS n, id FROM deliveries \
    WHERE id = $1 AND inline_attempted_at IS NOT NULL \
    UNION ALL SELECT attempted_at, trigger_kind, status_code, latency_ms, error, \
        response_excerpt, resolved_by, reason, 1, id FROM delivery_attempts \
    WHERE delivery_id = $1) a \
    ORDER BY attempted_at, n, id";

pub(super) fn attempt_rows<DB: SqlDb>(
    rows: &[DB::Row],
) -> Result<Vec<crate::store::AttemptRow>, crate::store::StoreError>
where
    for<'r> crate::store::AttemptRow: sqlx::FromRow<'r, DB::Row>,
{
    rows.iter()
        .map(sqlx::FromRow::from_row)
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}
