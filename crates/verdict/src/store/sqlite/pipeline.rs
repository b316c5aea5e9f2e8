//! SQLite's group commit: the batch's claims, acts and completions in one `BEGIN IMMEDIATE`
//! transaction. SQLite runs statements in-process, but each query is a hop to sqlx's
//! connection thread and back, so statements whose results nothing waits for share a query;
//! PostgreSQL fuses the same steps into one statement ([`super::super::postgres_pipeline`]).

use std::collections::HashSet;

use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::SqliteStore;
use super::effects::{apply_effects, insert_requests};
use crate::store::backend::execute_pushed;
use crate::store::deliveries::record_attempts;
use crate::store::failpoint::failpoint;
use crate::store::keys::{complete_calls_in, insert_claims};
use crate::store::pipeline::{batch_result, live_acts};
use crate::store::rows::push_values;
use crate::store::{Batch, BatchResult, Finished, HeldKey, NewEvent, PipelineStore, StoreError};

impl SqliteStore {
    /// The batch's statements, in one open transaction.
    async fn commit_in(
        conn: &mut SqliteConnection,
        batch: &Batch,
    ) -> Result<BatchResult, StoreError> {
        // Claims of new keys, alone or with their acts (whose re-check below then finds
        // them ours only if they won).
        let claims: Vec<_> = batch
            .claims
            .iter()
            .chain(batch.acts.iter().filter_map(|a| a.claim.as_ref()))
            .collect();
        // Each inserted key with the token of the claim that inserted it: of two claims of one
        // key in one batch, the first.
        let inserted: HashSet<_> = insert_claims(conn, &claims).await?.into_iter().collect();
        let claim_won = batch
            .claims
            .iter()
            .map(|c| inserted.contains(&(c.key.tenant_id, c.key.digest.clone(), c.lock_token)))
            .collect();

        // Acts whose key is still ours, and keyless ones. A key this transaction inserted is
        // ours under its claim's token with no re-check: a fresh signal's batch saves a
        // statement, a hop to the connection's thread and back.
        let held: Vec<_> = batch
            .acts
            .iter()
            .filter_map(|a| a.held.as_ref())
            .filter(|h| !inserted.contains(&(h.key.tenant_id, h.key.digest.clone(), h.lock_token)))
            .collect();
        let mut ours = hold_keys(conn, &held).await?;
        ours.extend(inserted);
        let live = live_acts(batch, |_, h| {
            ours.contains(&(h.key.tenant_id, h.key.digest.clone(), h.lock_token))
        });
        let acts: Vec<_> = live.iter().map(|&i| &batch.acts[i]).collect();
        let (mut outcomes, deliveries) = apply_effects(conn, &acts, batch.alert_window_ms).await?;
        insert_requests(conn, &acts, &mut outcomes).await?;
        let finished: Vec<_> = acts
            .iter()
            .zip(&outcomes)
            .map(|(a, o)| a.finished_for(o))
            .collect();
        // What nothing later reads goes in two queries, one hop each to SQLite's
        // connection thread instead of up to six: the events with the key completions
        // (their shape follows the number of acts), the attempts' records (theirs, the
        // number of attempts). One query for all would take a shape per combination
        // of the two, more than the statement cache keeps.
        let completions: Vec<_> = acts
            .iter()
            .zip(&finished)
            .filter_map(|(a, f)| a.held.as_ref().map(|h| (h, f)))
            .collect();
        let mut finish = QueryBuilder::new("");
        push_insert_events(
            &mut finish,
            &finished.iter().map(|f| &f.event).collect::<Vec<_>>(),
        );
        push_complete_keys(&mut finish, &completions);
        execute_pushed(conn, &mut finish).await?;
        record_attempts(conn, &batch.attempts.iter().collect::<Vec<_>>()).await?;
        complete_calls_in(&mut *conn, &batch.calls_done).await?;
        if !acts.is_empty() {
            failpoint!("act::before_commit");
        }

        Ok(batch_result(
            batch, live, outcomes, finished, deliveries, claim_won,
        ))
    }
}

#[async_trait::async_trait]
impl PipelineStore for SqliteStore {
    async fn commit(&self, batch: &Batch) -> Result<BatchResult, StoreError> {
        let mut tx = self.begin().await?;
        let result = Self::commit_in(&mut tx, batch).await?;
        tx.commit().await?;
        Ok(result)
    }
}
/// Re-checks the locks of keyed acts (token and state), taking each row's lock for the
/// rest of the transaction; returns the keys still ours.
async fn hold_keys(
    conn: &mut SqliteConnection,
    held: &[&HeldKey],
) -> Result<HashSet<(Uuid, Vec<u8>, Uuid)>, sqlx::Error> {
    if held.is_empty() {
        return Ok(Default::default());
    }
    let mut q = QueryBuilder::<Sqlite>::new(
        "UPDATE idempotency_keys SET locked_until = locked_until \
         WHERE state <> 'completed' AND (tenant_id, endpoint, key_digest, lock_token) IN \
         (VALUES ",
    );
    let mut list = q.separated(", ");
    for h in held {
        list.push("(");
        list.push_bind_unseparated(h.key.tenant_id);
        list.push_unseparated(", ");
        list.push_bind_unseparated(h.key.endpoint);
        list.push_unseparated(", ");
        list.push_bind_unseparated(h.key.digest.clone());
        list.push_unseparated(", ");
        list.push_bind_unseparated(h.lock_token);
        list.push_unseparated(")");
    }
    q.push(") RETURNING tenant_id, key_digest, lock_token");
    let rows: Vec<(Uuid, Vec<u8>, Uuid)> = q.build_query_as().fetch_all(conn).await?;
    Ok(rows.into_iter().collect())
}

/// Adds to `q` the statement that completes held keys with their responses, or moves them to
/// `dispatched` (still locked) while connector calls are outstanding (none if there are none).
fn push_complete_keys(q: &mut QueryBuilder<Sqlite>, done: &[(&HeldKey, &Finished)]) {
    if done.is_empty() {
        return;
    }
    q.push(
        "UPDATE idempotency_keys SET state = v.column7, response_status = v.column5, \
         response_body = v.column6, \
         ruling = CASE WHEN v.column7 = 'completed' THEN NULL ELSE ruling END, \
         lock_token = CASE WHEN v.column7 = 'completed' THEN NULL ELSE lock_token END, \
         locked_until = CASE WHEN v.column7 = 'completed' THEN 0 ELSE v.column8 END FROM (",
    );
    q.push_values(done, |mut row, (h, finished)| {
        row.push_bind(h.key.tenant_id)
            .push_bind(h.key.endpoint)
            .push_bind(h.key.digest.clone())
            .push_bind(h.lock_token)
            .push_bind(i32::from(finished.response.status))
            .push_bind(finished.stored_body())
            .push_bind(finished.key_state.as_str())
            .push_bind(finished.locked_until);
    });
    q.push(
        ") AS v WHERE idempotency_keys.tenant_id = v.column1 \
         AND idempotency_keys.endpoint = v.column2 \
         AND idempotency_keys.key_digest = v.column3 \
         AND idempotency_keys.lock_token = v.column4; ",
    );
}

/// Adds to `q` the statement that inserts `events` (none if there are none); an event already
/// stored (a retry) is left alone.
fn push_insert_events(q: &mut QueryBuilder<Sqlite>, events: &[&NewEvent]) {
    if events.is_empty() {
        return;
    }
    q.push("INSERT INTO events ");
    push_values(q, events);
    q.push(" ON CONFLICT DO NOTHING; ");
}
