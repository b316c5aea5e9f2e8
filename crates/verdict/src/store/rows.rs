//! Rows that define their own columns: each row type the store writes in bulk lists its
//! columns once, each with its name and its value in a row, and every statement that writes
//! it takes its column list, its parameters and its binds from that one list. A new column is
//! one entry here (and its migration); it cannot be bound to the wrong column, nor in a
//! different order from the one the statement names.
//!
//! PostgreSQL takes such rows as one array per column (`unnest($1::uuid[], …)`, see
//! [`super::postgres_pipeline`]); SQLite as a multi-row `VALUES` list ([`push_values`]).

use sqlx::{Database, Encode, QueryBuilder, Type};
use uuid::Uuid;

use super::{NewDelivery, NewEvent, RequestDraft};
use crate::domain::{ActionKind, stored_webhook_id};
use crate::store::ActionTarget;

/// One column of a row type `R`: its name and how to read its value from a row. The variant is
/// the column's type, so the PostgreSQL array type of its parameter comes from it too.
pub(crate) enum Col<R> {
    Uuid(&'static str, fn(&R) -> Uuid),
    OptUuid(&'static str, fn(&R) -> Option<Uuid>),
    Int8(&'static str, fn(&R) -> i64),
    Int4(&'static str, fn(&R) -> i32),
    Bool(&'static str, fn(&R) -> bool),
    OptInt4(&'static str, fn(&R) -> Option<i32>),
    Str(&'static str, fn(&R) -> &'static str),
    OptStr(&'static str, fn(&R) -> Option<&'static str>),
    Text(&'static str, fn(&R) -> String),
    OptText(&'static str, fn(&R) -> Option<String>),
    Bytes(&'static str, fn(&R) -> Vec<u8>),
    OptBytes(&'static str, fn(&R) -> Option<Vec<u8>>),
    /// Whether the row asks for an action: a boolean column named after it.
    Wants(ActionKind, fn(&R, ActionKind) -> bool),
}

impl<R> Col<R> {
    /// The column's name.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Uuid(name, _)
            | Self::OptUuid(name, _)
            | Self::Int8(name, _)
            | Self::Int4(name, _)
            | Self::Bool(name, _)
            | Self::OptInt4(name, _)
            | Self::Str(name, _)
            | Self::OptStr(name, _)
            | Self::Text(name, _)
            | Self::OptText(name, _)
            | Self::Bytes(name, _)
            | Self::OptBytes(name, _) => name,
            // Only built-in local actions have a column.
            Self::Wants(action, _) => action.built_in_name().unwrap_or("custom"),
        }
    }

    /// The column's PostgreSQL type.
    pub(crate) fn pg_type(&self) -> &'static str {
        match self {
            Self::Uuid(..) | Self::OptUuid(..) => "uuid",
            Self::Int8(..) => "int8",
            Self::Int4(..) | Self::OptInt4(..) => "int4",
            Self::Wants(..) | Self::Bool(..) => "bool",
            Self::Str(..) | Self::OptStr(..) | Self::Text(..) | Self::OptText(..) => "text",
            Self::Bytes(..) | Self::OptBytes(..) => "bytea",
        }
    }

    /// Binds this column's value in `row` as the next value of a `VALUES` row.
    fn push_bind<DB: Database>(
        &self,
        values: &mut sqlx::query_builder::Separated<'_, DB, &str>,
        row: &R,
    ) where
        for<'e> Uuid: Encode<'e, DB> + Type<DB>,
        for<'e> Option<Uuid>: Encode<'e, DB>,
        for<'e> i64: Encode<'e, DB> + Type<DB>,
        for<'e> i32: Encode<'e, DB> + Type<DB>,
        for<'e> Option<i32>: Encode<'e, DB>,
        for<'e> bool: Encode<'e, DB> + Type<DB>,
        for<'e> String: Encode<'e, DB> + Type<DB>,
        for<'e> Option<String>: Encode<'e, DB>,
        for<'e> Vec<u8>: Encode<'e, DB> + Type<DB>,
        for<'e> Option<Vec<u8>>: Encode<'e, DB>,
        for<'e> &'e str: Encode<'e, DB> + Type<DB>,
        for<'e> Option<&'e str>: Encode<'e, DB>,
    {
        match self {
            Self::Uuid(_, f) => values.push_bind(f(row)),
            Self::OptUuid(_, f) => values.push_bind(f(row)),
            Self::Int8(_, f) => values.push_bind(f(row)),
            Self::Int4(_, f) => values.push_bind(f(row)),
            Self::Bool(_, f) => values.push_bind(f(row)),
            Self::OptInt4(_, f) => values.push_bind(f(row)),
            Self::Str(_, f) => values.push_bind(f(row)),
            Self::OptStr(_, f) => values.push_bind(f(row)),
            Self::Text(_, f) => values.push_bind(f(row)),
            Self::OptText(_, f) => values.push_bind(f(row)),
            Self::Bytes(_, f) => values.push_bind(f(row)),
            Self::OptBytes(_, f) => values.push_bind(f(row)),
            Self::Wants(action, f) => values.push_bind(f(row, *action)),
        };
    }
}

/// A row type that names its columns.
pub(crate) trait Row: Sized {
    /// Its columns, in the order statements list them.
    fn columns() -> Vec<Col<Self>>;

    /// Its column names, comma-separated, for an `INSERT`'s column list or a `SELECT`.
    fn column_list() -> String {
        Self::columns()
            .iter()
            .map(Col::name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Pushes `(columns) VALUES (…), (…)` for `rows` onto a statement being built (SQLite's
/// multi-row inserts, and the few single-row ones either backend runs outside the batch).
pub(crate) fn push_values<DB: Database, R: Row>(q: &mut QueryBuilder<DB>, rows: &[&R])
where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
{
    let columns = R::columns();
    q.push(format!("({}) ", R::column_list()));
    q.push_values(rows, |mut values, row| {
        for column in &columns {
            column.push_bind(&mut values, row);
        }
    });
}

impl Row for NewEvent {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("id", |e| e.id),
            Col::Uuid("tenant_id", |e| e.tenant_id),
            Col::Str("signal_type", |e| e.signal_type),
            Col::Bytes("subject_hash", |e| e.subject_hash.clone()),
            Col::Int8("observed_at", |e| e.observed_at),
            Col::Text("attributes", |e| e.attributes.clone()),
            Col::Text("metadata", |e| e.metadata.clone()),
            Col::Bool("metadata_in_callback", |e| e.metadata_in_callback),
            Col::Str("decision", |e| e.decision.as_str()),
            Col::Int8("playbook_version", |e| e.playbook_version),
            Col::Text("rule", |e| e.rule.clone()),
            Col::Text("actions", |e| e.actions.clone()),
            Col::Int8("created_at", |e| e.created_at),
            Col::Int8("evaluated_at", |e| e.evaluated_at),
            Col::Text("facts", |e| e.facts.clone()),
            Col::Str("feed", |e| e.feed.as_str()),
            Col::Bytes("signal_key", |e| e.signal_key.clone()),
        ]
    }
}

/// A callback's outbox row for one endpoint, as the group commit inserts it: pending (or
/// suspended while the endpoint is disabled), not yet attempted, due now, and leased to the
/// inline attempt until `leased_until`.
pub(crate) struct OutboxRow<'a> {
    pub target: &'a ActionTarget,
    pub delivery: &'a NewDelivery,
}

impl Row for OutboxRow<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("id", |r| r.delivery.id),
            Col::Uuid("tenant_id", |r| r.target.tenant_id),
            Col::Uuid("event_id", |r| r.target.event_id),
            Col::Bytes("signal_key", |r| r.target.signal_key.clone()),
            Col::Int8("observed_at", |r| r.target.observed_at),
            Col::Text("webhook_id", |r| {
                stored_webhook_id(
                    &r.delivery.webhook_id,
                    r.target.tenant_id,
                    r.target.event_id,
                    ActionKind::Callback.as_str(),
                    r.delivery.endpoint_id,
                )
            }),
            // Empty when the event renders it: a callback's envelope is never empty.
            Col::Bytes("payload", |r| {
                if r.delivery.payload_in_event {
                    Vec::new()
                } else {
                    r.delivery.payload.clone()
                }
            }),
            Col::Str("status", |r| r.delivery.status.as_str()),
            Col::Int8("attempts", |_| 0),
            Col::Int8("next_attempt_at", |r| r.target.now),
            Col::Int8("leased_until", |r| r.delivery.leased_until),
            Col::Int8("created_at", |r| r.target.now),
            Col::Int8("updated_at", |r| r.target.now),
            Col::Uuid("endpoint_id", |r| r.delivery.endpoint_id),
        ]
    }
}

/// A connector action request's outbox row: like a callback's, with its action and connector,
/// its payload sealed.
pub(crate) struct RequestRow<'a> {
    pub target: &'a ActionTarget,
    pub request: &'a RequestDraft,
}

impl Row for RequestRow<'_> {
    fn columns() -> Vec<Col<Self>> {
        vec![
            Col::Uuid("id", |r| r.request.id),
            Col::Uuid("tenant_id", |r| r.target.tenant_id),
            Col::Uuid("event_id", |r| r.target.event_id),
            Col::Bytes("signal_key", |r| r.target.signal_key.clone()),
            Col::Int8("observed_at", |r| r.target.observed_at),
            Col::Text("webhook_id", |r| {
                stored_webhook_id(
                    &r.request.webhook_id,
                    r.target.tenant_id,
                    r.target.event_id,
                    r.request.action.as_str(),
                    Uuid::nil(),
                )
            }),
            Col::Bytes("payload", |r| r.request.payload.clone()),
            Col::Str("status", |_| "pending"),
            Col::Int8("attempts", |_| 0),
            Col::Int8("next_attempt_at", |r| r.target.now),
            Col::Int8("leased_until", |r| r.request.leased_until),
            Col::Int8("created_at", |r| r.target.now),
            Col::Int8("updated_at", |r| r.target.now),
            Col::Text("action", |r| r.request.action.to_string()),
            Col::Text("connector", |r| r.request.connector.to_string()),
        ]
    }
}
