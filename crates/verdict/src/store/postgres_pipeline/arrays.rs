//! The array bindings the statements share: outbox rows, events, stored responses.

use sqlx::Postgres;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use crate::store::{Act, NewDelivery, NewEvent, StoredResponse};

/// A statement with its arguments still being bound.
pub(super) type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

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
        .bind(rows.iter().map(|r| r.i).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.delivery.id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.act.target.tenant_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.act.target.event_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.act.target.signal_key.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.delivery.webhook_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.delivery.payload.clone())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.act.target.now).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.delivery.leased_until)
                .collect::<Vec<_>>(),
        )
}

/// Binds stored responses as the two arrays `(status, body)`.
pub(super) fn bind_responses<'q>(query: PgQuery<'q>, responses: &[&StoredResponse]) -> PgQuery<'q> {
    query
        .bind(
            responses
                .iter()
                .map(|r| i32::from(r.status))
                .collect::<Vec<_>>(),
        )
        .bind(responses.iter().map(|r| r.body.clone()).collect::<Vec<_>>())
}

/// Binds events as the fifteen arrays of the `events` columns, in the table's order.
pub(super) fn bind_events<'q>(query: PgQuery<'q>, events: &[&NewEvent]) -> PgQuery<'q> {
    query
        .bind(events.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.tenant_id).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.signal_type).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.subject_hash.clone())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.observed_at).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.attributes.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.metadata.clone())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.decision).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.playbook_version)
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.rule.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.actions.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.evaluated_at).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.facts.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.feed).collect::<Vec<_>>())
}
