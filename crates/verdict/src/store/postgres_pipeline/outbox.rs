//! [`OUTBOX`]: the outbox rows of the acts [`super::apply()`] did not settle, with
//! envelopes built from their actual outcomes.

use std::sync::LazyLock;

use sqlx::PgConnection;
use sqlx::Row as _;

use super::index;
use super::params::{Param, Rows, bind_all, render};
use crate::domain::Applied;
use crate::store::pipeline::ActOutcome;
use crate::store::rows::OutboxRow;
use crate::store::{Batch, NewDelivery, StoreError};

/// The callbacks' outbox rows, one per signal and endpoint: per row, whether this statement
/// inserted it (only then does its inline attempt go out) and whether this signal's event
/// holds it.
const TEMPLATE: &str = r#"
WITH outbox_in AS (
    SELECT * FROM {o}
), inserted AS (
    INSERT INTO deliveries ({o.columns})
    SELECT DISTINCT ON (tenant_id, signal_key, endpoint_id) {o.columns}
    FROM outbox_in ORDER BY tenant_id, signal_key, endpoint_id, i
    ON CONFLICT DO NOTHING RETURNING id, tenant_id, signal_key, endpoint_id, event_id
)
SELECT o.i, o.id,
    -- A row with this draft's id is this commit's: inserted now, or by APPLY before it.
    mine.id IS NOT NULL OR EXISTS (SELECT 1 FROM deliveries y WHERE y.id = o.id) AS fresh,
    COALESCE(COALESCE(w.event_id, (SELECT x.event_id FROM deliveries x
        WHERE x.tenant_id = o.tenant_id AND x.observed_at = o.observed_at
        AND x.signal_key = o.signal_key AND x.action = 'callback'
        AND x.endpoint_id = o.endpoint_id)) = o.event_id, FALSE)
        AS ours
FROM outbox_in o
LEFT JOIN inserted mine ON mine.id = o.id
LEFT JOIN inserted w ON w.tenant_id = o.tenant_id AND w.signal_key = o.signal_key
    AND w.endpoint_id = o.endpoint_id
"#;

/// [`TEMPLATE`], rendered.
static OUTBOX: LazyLock<String> =
    LazyLock::new(|| with(Vec::new(), &[], |inputs| render(TEMPLATE, inputs)));

/// Runs `f` with [`OUTBOX`]'s inputs in parameter order: each row at the position it reports
/// under.
fn with<T>(index: Vec<i32>, rows: &[OutboxRow], f: impl FnOnce(&[&dyn Param]) -> T) -> T {
    f(&[&Rows::indexed("o", index, rows.iter().collect())])
}

/// Builds each live act's envelope from its effects and records the outbox rows; fills in the
/// callbacks' outcomes and returns the rows, per live act.
pub(in crate::store) async fn outbox(
    conn: &mut PgConnection,
    batch: &Batch,
    live: &[usize],
    outcomes: &mut [ActOutcome],
) -> Result<Vec<Vec<NewDelivery>>, StoreError> {
    let deliveries: Vec<Vec<NewDelivery>> = live
        .iter()
        .zip(outcomes.iter())
        .map(|(&i, o)| batch.acts[i].deliveries_for(&o.effects))
        .collect();
    // Each row reports its position among the live acts.
    let (positions, rows): (Vec<i32>, Vec<OutboxRow>) = live
        .iter()
        .zip(&deliveries)
        .enumerate()
        .flat_map(|(n, (&i, ds))| {
            let target = &batch.acts[i].target;
            ds.iter()
                .map(move |delivery| (index(n), OutboxRow { target, delivery }))
        })
        .unzip();
    if rows.is_empty() {
        return Ok(deliveries);
    }
    let stored: Vec<(i32, uuid::Uuid, bool, bool)> = with(positions, &rows, |inputs| {
        bind_all(sqlx::query(OUTBOX.as_str()), inputs)
    })
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| {
        Ok((
            row.try_get(0)?,
            row.try_get(1)?,
            row.try_get(2)?,
            row.try_get(3)?,
        ))
    })
    .collect::<Result<_, sqlx::Error>>()?;
    for (n, id, fresh, ours) in stored {
        let outcome = usize::try_from(n)
            .ok()
            .and_then(|n| outcomes.get_mut(n))
            .ok_or_else(|| StoreError::Corrupt("an outbox row of no signal".into()))?;
        // Done where this event holds any of them: the signal's callback is its.
        if outcome.callback != Some(Applied::Done) {
            outcome.callback = Some(if ours || fresh {
                Applied::Done
            } else {
                Applied::AlreadyDone
            });
        }
        if fresh {
            outcome.callbacks_inserted.push(id);
        }
    }
    Ok(deliveries)
}
