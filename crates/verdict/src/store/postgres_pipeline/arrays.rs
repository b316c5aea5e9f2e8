//! The array bindings the statements share: outbox rows, events, stored responses.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use crate::store::{Act, NewDelivery, NewEvent, StoredResponse};

/// A statement with its arguments still being bound.
pub(super) type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

/// One column of `rows`, as the array bound for an `unnest`.
pub(super) fn column<T, U>(rows: &[T], value: impl FnMut(&T) -> U) -> Vec<U> {
    rows.iter().map(value).collect()
}

/// An outbox row to insert: the position its statement reports it under, its act and its row.
pub(super) struct OutboxRow<'a> {
    pub i: i32,
    pub act: &'a Act,
    pub delivery: &'a NewDelivery,
}

/// Binds outbox rows as the nine arrays `(i, id, tenant_id, event_id, signal_key, webhook_id,
/// payload, now, leased_until)`.
pub(super) fn bind_outbox<'q>(query: PgQuery<'q>, rows: &[OutboxRow]) -> PgQuery<'q> {
    query
        .bind(column(rows, |r| r.i))
        .bind(column(rows, |r| r.delivery.id))
        .bind(column(rows, |r| r.act.target.tenant_id))
        .bind(column(rows, |r| r.act.target.event_id))
        .bind(column(rows, |r| r.act.target.signal_key.clone()))
        .bind(column(rows, |r| r.delivery.webhook_id.clone()))
        .bind(column(rows, |r| r.delivery.payload.clone()))
        .bind(column(rows, |r| r.act.target.now))
        .bind(column(rows, |r| r.delivery.leased_until))
}

/// Binds stored responses as the two arrays `(status, body)`.
pub(super) fn bind_responses<'q>(query: PgQuery<'q>, responses: &[&StoredResponse]) -> PgQuery<'q> {
    query
        .bind(column(responses, |r| i32::from(r.status)))
        .bind(column(responses, |r| r.body.clone()))
}

/// Binds events as the fifteen arrays of the `events` columns, in the table's order.
pub(super) fn bind_events<'q>(query: PgQuery<'q>, events: &[&NewEvent]) -> PgQuery<'q> {
    query
        .bind(column(events, |e| e.id))
        .bind(column(events, |e| e.tenant_id))
        .bind(column(events, |e| e.signal_type))
        .bind(column(events, |e| e.subject_hash.clone()))
        .bind(column(events, |e| e.observed_at))
        .bind(column(events, |e| e.attributes.clone()))
        .bind(column(events, |e| e.metadata.clone()))
        .bind(column(events, |e| e.decision))
        .bind(column(events, |e| e.playbook_version))
        .bind(column(events, |e| e.rule.clone()))
        .bind(column(events, |e| e.actions.clone()))
        .bind(column(events, |e| e.created_at))
        .bind(column(events, |e| e.evaluated_at))
        .bind(column(events, |e| e.facts.clone()))
        .bind(column(events, |e| e.feed))
}
