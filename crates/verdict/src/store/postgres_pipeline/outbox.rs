//! [`OUTBOX`]: the outbox rows of the acts [`super::apply::APPLY`] did not settle, with
//! envelopes built from their actual outcomes.

use sqlx::PgConnection;
use sqlx::Row;

use super::arrays::{OutboxRow, bind_outbox};
use super::index;
use crate::actions::Applied;
use crate::store::pipeline::ActOutcome;
use crate::store::{Batch, NewDelivery, StoreError};

/// The callbacks' outbox rows, one per signal: per row, whether this statement inserted it
/// (only then does the inline attempt go out) and whether this signal's event holds it.
pub(super) const OUTBOX: &str = r#"
WITH outbox_in AS (
    SELECT * FROM unnest($1::int4[], $2::uuid[], $3::uuid[], $4::uuid[], $5::bytea[],
        $6::text[], $7::bytea[], $8::int8[], $9::int8[])
        AS o(i, id, tenant_id, event_id, signal_key, webhook_id, payload, now, leased_until)
), inserted AS (
    INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
        attempts, next_attempt_at, leased_until, created_at, updated_at)
    SELECT DISTINCT ON (tenant_id, signal_key) id, tenant_id, event_id, signal_key, webhook_id,
        payload, 'pending', 0, now, leased_until, now, now
    FROM outbox_in ORDER BY tenant_id, signal_key, i
    ON CONFLICT DO NOTHING RETURNING id, tenant_id, signal_key, event_id
)
SELECT o.i, mine.id IS NOT NULL AS fresh,
    COALESCE(COALESCE(w.event_id, (SELECT x.event_id FROM deliveries x
        WHERE x.tenant_id = o.tenant_id AND x.signal_key = o.signal_key)) = o.event_id, FALSE)
        AS ours
FROM outbox_in o
LEFT JOIN inserted mine ON mine.id = o.id
LEFT JOIN inserted w ON w.tenant_id = o.tenant_id AND w.signal_key = o.signal_key
"#;

/// Builds each live act's envelope from its effects and records the outbox rows; fills in the
/// callbacks' outcomes and returns the rows, per live act.
pub(in crate::store) async fn outbox(
    conn: &mut PgConnection,
    batch: &Batch,
    live: &[usize],
    outcomes: &mut [ActOutcome],
) -> Result<Vec<Option<NewDelivery>>, StoreError> {
    let deliveries: Vec<Option<NewDelivery>> = live
        .iter()
        .zip(outcomes.iter())
        .map(|(&i, o)| batch.acts[i].delivery_for(&o.effects))
        .collect();
    // Each row reports its position among the live acts.
    let rows: Vec<OutboxRow> = live
        .iter()
        .zip(&deliveries)
        .enumerate()
        .filter_map(|(n, (&i, d))| {
            d.as_ref().map(|delivery| OutboxRow {
                i: index(n),
                act: &batch.acts[i],
                delivery,
            })
        })
        .collect();
    if rows.is_empty() {
        return Ok(deliveries);
    }
    let stored: Vec<(i32, bool, bool)> = bind_outbox(sqlx::query(OUTBOX), &rows)
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    for (n, fresh, ours) in stored {
        let outcome = usize::try_from(n)
            .ok()
            .and_then(|n| outcomes.get_mut(n))
            .ok_or_else(|| StoreError::Corrupt("an outbox row of no signal".into()))?;
        outcome.callback = Some(if ours || fresh {
            Applied::Done
        } else {
            Applied::AlreadyDone
        });
        outcome.callback_inserted = fresh;
    }
    Ok(deliveries)
}
