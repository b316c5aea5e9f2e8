//! Callback envelopes rendered at lease time from their events' rows, for the outbox rows
//! that keep none.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::DueDelivery;
use crate::domain::ActionKind;
use crate::store::StoreError;
use crate::store::backend::SqlDb;

/// An event's columns a callback's envelope is rendered from.
#[derive(Debug, sqlx::FromRow)]
struct EnvelopeColumns {
    id: Uuid,
    tenant_id: Uuid,
    /// The signal type's name, or `unmapped` for a feed event no signal type maps to.
    signal_type: String,
    subject_hash: Vec<u8>,
    /// When the event was stored (unix ms): the envelope's `timestamp`.
    created_at: i64,
    decision: String,
    /// The actions column, in its stored form.
    actions: String,
    /// The metadata column: a JSON object.
    metadata: String,
    /// The feed it came in through.
    feed: String,
}

/// The columns of [`EnvelopeColumns`], as `events` names them.
const ENVELOPE_COLUMNS: &str =
    "id, tenant_id, signal_type, subject_hash, created_at, decision, actions, metadata, feed";

/// Whether a leased delivery is a callback whose envelope its event's row renders.
fn renders_from_event(d: &DueDelivery) -> bool {
    d.payload.is_empty() && d.action == ActionKind::Callback.as_str()
}

/// The envelope of `event_id`'s callback, rendered from its row among `events`.
fn envelope_from(events: &[EnvelopeColumns], event_id: Uuid) -> Result<Vec<u8>, StoreError> {
    let event = events
        .iter()
        .find(|e| e.id == event_id)
        .ok_or_else(|| StoreError::Corrupt("a callback stored without its event".into()))?;
    // An event whose callback renders its envelope keeps the metadata (`{}` at least).
    let metadata: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&event.metadata).map_err(|e| StoreError::Corrupt(Box::new(e)))?;
    crate::domain::CallbackEnvelope {
        event_id: event.id,
        tenant_id: event.tenant_id,
        signal_type: &event.signal_type,
        subject_hash: &event.subject_hash,
        created_at: event.created_at,
        decision: &event.decision,
        metadata: &metadata,
        feed: &event.feed,
    }
    .render_from_event(&event.actions)
    .map_err(|e| StoreError::Corrupt(Box::new(e)))
}

/// Fills in the envelopes of the leased callbacks whose outbox rows keep none (an empty
/// payload, which no stored envelope is), rendered from their events' rows.
pub(super) async fn with_envelopes<DB: SqlDb, E>(
    exec: E,
    mut due: Vec<DueDelivery>,
) -> Result<Vec<DueDelivery>, StoreError>
where
    for<'c> E: Executor<'c, Database = DB> + Copy,
    DB::Arguments: IntoArguments<DB>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> i64: Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Vec<u8>: Decode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    let in_event: Vec<Uuid> = due
        .iter()
        .filter(|d| renders_from_event(d))
        .map(|d| d.event_id)
        .collect();
    if in_event.is_empty() {
        return Ok(due);
    }
    let mut q =
        sqlx::QueryBuilder::<DB>::new(format!("SELECT {ENVELOPE_COLUMNS} FROM events WHERE id"));
    DB::push_in_ids(&mut q, &in_event);
    let events: Vec<EnvelopeColumns> = q.build_query_as().fetch_all(exec).await?;
    // A callback whose envelope cannot be rendered is left out of this lease and made dead
    // with why (an operator can redeliver it once its event is mended), not allowed to fail
    // the lease: the other deliveries go out.
    let mut unrenderable = Vec::new();
    due.retain_mut(|d| {
        if !renders_from_event(d) {
            return true;
        }
        match envelope_from(&events, d.event_id) {
            Ok(payload) => {
                d.payload = payload;
                true
            }
            Err(err) => {
                tracing::error!(delivery_id = %d.id, error = ?err, "a callback's envelope could not be rendered from its event");
                unrenderable.push(d.id);
                false
            }
        }
    });
    for id in unrenderable {
        sqlx::query(
            "UPDATE deliveries SET status = $2, leased_until = 0, last_error = $3 WHERE id = $1",
        )
        .bind(id)
        .bind(crate::domain::DeliveryStatus::Dead.as_str())
        .bind(UNRENDERABLE)
        .execute(exec)
        .await?;
    }
    Ok(due)
}

/// Why a callback left out of its lease is dead.
const UNRENDERABLE: &str = "its envelope could not be rendered from its event";

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: Uuid, actions: &str, metadata: &str) -> EnvelopeColumns {
        EnvelopeColumns {
            id,
            tenant_id: Uuid::nil(),
            signal_type: "sim_swap".into(),
            subject_hash: vec![0xab],
            created_at: 1_764_960_000_123,
            decision: "deny".into(),
            actions: actions.into(),
            metadata: metadata.into(),
            feed: "signals".into(),
        }
    }

    #[test]
    fn a_callbacks_envelope_is_rendered_from_its_events_row() {
        let id = Uuid::now_v7();
        let events = [event(id, "lock_account,callback", r#"{"ref":"r-1"}"#)];
        let envelope: serde_json::Value =
            serde_json::from_slice(&envelope_from(&events, id).unwrap()).unwrap();
        assert_eq!(envelope["event_id"], id.to_string());
        assert_eq!(
            envelope["actions"],
            serde_json::json!([{"action": "lock_account", "outcome": "done"}])
        );
        assert_eq!(envelope["metadata"]["ref"], "r-1");
        assert_eq!(envelope["timestamp"], "2025-12-05T18:40:00.123Z");
    }

    #[test]
    fn a_callback_without_its_event_or_with_unreadable_columns_is_corrupt() {
        let id = Uuid::now_v7();
        assert!(matches!(
            envelope_from(&[], id),
            Err(StoreError::Corrupt(_))
        ));
        for (actions, metadata) in [("Nope", "{}"), ("deny", "")] {
            let events = [event(id, actions, metadata)];
            assert!(matches!(
                envelope_from(&events, id),
                Err(StoreError::Corrupt(_))
            ));
        }
    }
}
