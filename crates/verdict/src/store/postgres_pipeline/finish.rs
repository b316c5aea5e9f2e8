//! [`FINISH`]: the events and key completions of the acts [`super::apply::APPLY`] did not
//! settle.

use sqlx::PgConnection;

use super::arrays::{bind_events, bind_responses, column};
use crate::store::pipeline::Finished;
use crate::store::{HeldKey, StoreError, StoredResponse};

/// The live acts' events and the completions of their keys (with the responses the keys
/// replay), where the lock is still this request's.
pub(super) const FINISH: &str = r#"
WITH event_ins AS (
    INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, attributes,
        metadata, decision, playbook_version, rule, actions, created_at, evaluated_at, facts,
        feed)
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::int8[],
        $6::text[], $7::text[], $8::text[], $9::int8[], $10::text[], $11::text[], $12::int8[],
        $13::int8[], $14::text[], $15::text[])
    ON CONFLICT DO NOTHING
)
UPDATE idempotency_keys k SET state = 'completed', response_status = v.status,
    response_body = v.body, lock_token = NULL, locked_until = 0
FROM unnest($16::uuid[], $17::text[], $18::bytea[], $19::uuid[], $20::int4[], $21::bytea[])
    AS v(tenant_id, endpoint, key_digest, lock_token, status, body)
WHERE k.tenant_id = v.tenant_id AND k.endpoint = v.endpoint AND k.key_digest = v.key_digest
    AND k.lock_token = v.lock_token
"#;

/// Runs [`FINISH`]: stores the live acts' events and completes the keys still held with their
/// responses.
pub(in crate::store) async fn finish(
    conn: &mut PgConnection,
    finished: &[Finished],
    completions: &[(&HeldKey, &StoredResponse)],
) -> Result<(), StoreError> {
    let events: Vec<_> = finished.iter().map(|f| &f.event).collect();
    if events.is_empty() && completions.is_empty() {
        return Ok(());
    }
    let responses: Vec<_> = completions.iter().map(|(_, r)| *r).collect();
    let query = bind_events(sqlx::query(FINISH), &events)
        .bind(column(completions, |(h, _)| h.key.tenant_id))
        .bind(column(completions, |(h, _)| h.key.endpoint))
        .bind(column(completions, |(h, _)| h.key.digest.clone()))
        .bind(column(completions, |(h, _)| h.lock_token));
    bind_responses(query, &responses)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
