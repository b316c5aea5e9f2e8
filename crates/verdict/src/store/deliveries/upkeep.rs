//! The outbox as other aggregates change it: the settled deliveries pruned with their events,
//! and an endpoint's suspended callbacks when it is enabled.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use crate::store::backend::SqlDb;

/// Deletes the deliveries of `events` that are settled (not pending), and their
/// attempts; returns how many of each (an inline attempt recorded on its delivery counts).
pub(crate) async fn delete_settled_deliveries<DB, C>(
    conn: &mut C,
    events: &[uuid::Uuid],
) -> Result<(u64, u64), sqlx::Error>
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
    // The deliveries first: a writer that holds one (a resolution settling it) is waited
    // out, and the attempts' own statement, with a snapshot of its own, then sees the attempt
    // that writer committed. No foreign key keeps attempts from outliving their delivery
    // (postgres/0028): this order does.
    let mut q = sqlx::QueryBuilder::<DB>::new(
        "DELETE FROM deliveries WHERE status <> 'pending' AND event_id",
    );
    DB::push_in_ids(&mut q, events);
    q.push(
        " RETURNING id, CAST(CASE WHEN inline_attempted_at IS NULL THEN 0 ELSE 1 END AS BIGINT)",
    );
    let gone: Vec<(Uuid, i64)> = q.build_query_as().fetch_all(&mut *conn).await?;
    if gone.is_empty() {
        return Ok((0, 0));
    }
    let ids: Vec<Uuid> = gone.iter().map(|(id, _)| *id).collect();
    let mut q = sqlx::QueryBuilder::<DB>::new("DELETE FROM delivery_attempts WHERE delivery_id");
    DB::push_in_ids(&mut q, &ids);
    let rows = DB::rows_affected(&q.build().execute(&mut *conn).await?);
    let deliveries = gone.len() as u64;
    let attempts = rows
        + gone
            .iter()
            .map(|(_, inline)| *inline)
            .sum::<i64>()
            .unsigned_abs();
    Ok((deliveries, attempts))
}

/// Makes an endpoint's suspended callbacks due at `now` (pending, unleased, never attempted,
/// so with their whole retry budget); returns how many.
pub(crate) async fn resume_suspended<DB, C>(
    conn: &mut C,
    tenant_id: Uuid,
    endpoint_id: Uuid,
    now: i64,
) -> Result<u64, sqlx::Error>
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
    let done = sqlx::query(
        "UPDATE deliveries SET status = 'pending', next_attempt_at = $2, leased_until = 0, \
         updated_at = $2 WHERE tenant_id = $1 AND troubled_status = 'suspended' \
         AND endpoint_id = $3",
    )
    .bind(tenant_id)
    .bind(now)
    .bind(endpoint_id)
    .execute(conn)
    .await?;
    Ok(DB::rows_affected(&done))
}

/// How many of an endpoint's callbacks are suspended.
pub(crate) async fn count_suspended<DB, C>(
    conn: &mut C,
    tenant_id: Uuid,
    endpoint_id: Uuid,
) -> Result<u64, sqlx::Error>
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
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM deliveries WHERE tenant_id = $1 AND troubled_status = 'suspended' \
         AND endpoint_id = $2",
    )
    .bind(tenant_id)
    .bind(endpoint_id)
    .fetch_one(conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or(0))
}
