//! [`REQUESTS`]: the connector action requests of the acts [`super::apply()`] did not
//! settle (every act with requests), for the actions each applied itself.

use std::sync::LazyLock;

use sqlx::PgConnection;
use sqlx::Row as _;

use super::index;
use super::params::{Param, Rows, bind_all, render};
use crate::domain::ActionKind;
use crate::store::pipeline::ActOutcome;
use crate::store::rows::RequestRow;
use crate::store::{Batch, StoreError};

/// The requests, at most one per event and action (and per signal and action): per row,
/// whether this statement inserted it and whether this signal's event holds it (inserted by
/// an earlier attempt of the same event).
const TEMPLATE: &str = r#"
WITH request_in AS (
    SELECT * FROM {r}
), inserted AS (
    INSERT INTO deliveries ({r.columns})
    SELECT {r.columns} FROM request_in ORDER BY tenant_id, signal_key, action, i
    ON CONFLICT DO NOTHING RETURNING id
)
SELECT r.i, r.action,
    -- A row with this draft's id is this commit's: inserted now, or by APPLY before it.
    mine.id IS NOT NULL OR EXISTS (SELECT 1 FROM deliveries y WHERE y.id = r.id) AS fresh,
    mine.id IS NOT NULL OR EXISTS (SELECT 1 FROM deliveries x
        WHERE x.event_id = r.event_id AND x.action = r.action) AS ours
FROM request_in r
LEFT JOIN inserted mine ON mine.id = r.id
"#;

/// [`TEMPLATE`], rendered.
static REQUESTS: LazyLock<String> =
    LazyLock::new(|| with(Vec::new(), &[], |inputs| render(TEMPLATE, inputs)));

/// Runs `f` with [`REQUESTS`]'s inputs in parameter order: each row at the position it
/// reports under.
fn with<T>(index: Vec<i32>, rows: &[RequestRow], f: impl FnOnce(&[&dyn Param]) -> T) -> T {
    f(&[&Rows::indexed("r", index, rows.iter().collect())])
}

/// Records the requests of the actions each live act in `live` applied, and fills in which
/// its event holds.
pub(in crate::store) async fn requests(
    conn: &mut PgConnection,
    batch: &Batch,
    live: &[usize],
    outcomes: &mut [ActOutcome],
) -> Result<(), StoreError> {
    // Each row reports its position among the live acts.
    let (positions, rows): (Vec<i32>, Vec<RequestRow>) = live
        .iter()
        .zip(outcomes.iter())
        .enumerate()
        .flat_map(|(n, (&i, outcome))| {
            let act = &batch.acts[i];
            act.requests_for(&outcome.effects)
                .into_iter()
                .map(move |request| {
                    (
                        index(n),
                        RequestRow {
                            target: &act.target,
                            request,
                        },
                    )
                })
        })
        .unzip();
    if rows.is_empty() {
        return Ok(());
    }
    let stored: Vec<(i32, String, bool, bool)> = with(positions, &rows, |inputs| {
        bind_all(sqlx::query(REQUESTS.as_str()), inputs)
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
    for (n, action, fresh, ours) in stored {
        let outcome = usize::try_from(n)
            .ok()
            .and_then(|n| outcomes.get_mut(n))
            .ok_or_else(|| StoreError::Corrupt("a request of no signal".into()))?;
        let action: ActionKind = action
            .parse()
            .map_err(|e| StoreError::Corrupt(Box::new(e)))?;
        if ours {
            outcome.requests.push((action, fresh));
        }
    }
    Ok(())
}
