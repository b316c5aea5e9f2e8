//! [`FINISH`]: the events and key completions of the acts [`super::apply()`] did not
//! settle.

use std::sync::LazyLock;

use sqlx::PgConnection;

use super::inputs::Completion;
use super::params::{Param, Rows, bind_all, render};
use crate::store::pipeline::Finished;
use crate::store::{HeldKey, NewEvent, StoreError};

/// The live acts' events and the completions of their keys (with the responses the keys
/// replay; or `dispatched`, still locked, while connector calls are outstanding), where the
/// lock is still this request's.
const TEMPLATE: &str = r#"
WITH event_ins AS (
    INSERT INTO events ({events.columns})
    SELECT * FROM {events}
    ON CONFLICT DO NOTHING
)
UPDATE idempotency_keys k SET state = v.state, response_status = v.status,
    response_body = v.body,
    ruling = CASE WHEN v.state = 'completed' THEN NULL ELSE k.ruling END,
    lock_token = CASE WHEN v.state = 'completed' THEN NULL ELSE k.lock_token END,
    locked_until = CASE WHEN v.state = 'completed' THEN 0 ELSE v.locked_until END
FROM {v}
WHERE k.tenant_id = v.tenant_id AND k.endpoint = v.endpoint AND k.key_digest = v.key_digest
    AND k.lock_token = v.lock_token
"#;

/// [`TEMPLATE`], rendered.
static FINISH: LazyLock<String> =
    LazyLock::new(|| with(&[], &[], |inputs| render(TEMPLATE, inputs)));

/// Runs `f` with [`FINISH`]'s inputs in parameter order.
fn with<T>(
    events: &[&NewEvent],
    completions: &[Completion],
    f: impl FnOnce(&[&dyn Param]) -> T,
) -> T {
    f(&[
        &Rows::new("events", events.to_vec()),
        &Rows::new("v", completions.iter().collect()),
    ])
}

/// Runs [`FINISH`]: stores the live acts' events and completes the keys still held with their
/// responses.
pub(in crate::store) async fn finish(
    conn: &mut PgConnection,
    finished: &[Finished],
    completions: &[(&HeldKey, &Finished)],
) -> Result<(), StoreError> {
    let events: Vec<_> = finished.iter().map(|f| &f.event).collect();
    if events.is_empty() && completions.is_empty() {
        return Ok(());
    }
    let completions: Vec<_> = completions
        .iter()
        .map(|&(held, finished)| Completion { held, finished })
        .collect();
    with(&events, &completions, |inputs| {
        bind_all(sqlx::query(FINISH.as_str()), inputs)
    })
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::Row;

    #[test]
    fn finish_numbers_one_parameter_per_column() {
        let columns = NewEvent::columns().len() + Completion::columns().len();
        let last = format!("${columns}::");
        let past = format!("${}::", columns + 1);
        assert!(FINISH.contains(&last), "{}", *FINISH);
        assert!(!FINISH.contains(&past), "{}", *FINISH);
    }
}
