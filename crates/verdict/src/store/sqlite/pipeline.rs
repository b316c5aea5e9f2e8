//! SQLite's group commit: the batch's claims, acts and completions in one `BEGIN IMMEDIATE`
//! transaction. SQLite runs statements in-process, but each query is a hop to sqlx's
//! connection thread and back, so statements whose results nothing waits for share a query;
//! PostgreSQL fuses the same steps into one statement ([`super::super::postgres_pipeline`]).

use std::collections::HashSet;

use sqlx::pool::PoolConnection;
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::SqliteStore;
use super::effects::{apply_effects, insert_requests};
use crate::store::deliveries::push_record_attempts;
use crate::store::failpoint::failpoint;
use crate::store::keys::{complete_calls_in, push_insert_claims};
use crate::store::pipeline::{batch_result, live_acts};
use crate::store::rows::push_values;
use crate::store::{
    AttemptRecord, Batch, BatchResult, Claim, Finished, HeldKey, NewEvent, PipelineStore,
    StoreError,
};

impl SqliteStore {
    /// The batch's statements, in one transaction: `BEGIN IMMEDIATE` in the first query,
    /// `COMMIT` in the last.
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
        // key in one batch, the first. The transaction begins in the same query, and the
        // attempts' records (of earlier batches' deliveries) go in it too.
        let attempts: Vec<_> = batch.attempts.iter().collect();
        let inserted: HashSet<_> = begin_with_claims(conn, &attempts, &claims)
            .await?
            .into_iter()
            .collect();
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
        // The events with the key completions and the `COMMIT`: what nothing later reads, in
        // one hop to SQLite's connection thread.
        complete_calls_in(&mut *conn, &batch.calls_done).await?;
        if !acts.is_empty() {
            failpoint!("act::before_commit");
        }
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
        finish.push("COMMIT");
        finish.build().execute(&mut *conn).await?;

        Ok(batch_result(
            batch, live, outcomes, finished, deliveries, claim_won,
        ))
    }
}

#[async_trait::async_trait]
impl PipelineStore for SqliteStore {
    /// The batch's transaction begins in its first query and commits in its last, not in
    /// queries of their own: two hops to the connection's thread fewer. sqlx does not know of
    /// it, so a batch that fails or is dropped half-way closes the connection instead of
    /// handing it back to the pool, and SQLite rolls the transaction back as it closes.
    async fn commit(&self, batch: &Batch) -> Result<BatchResult, StoreError> {
        let mut batch_tx = Unfinished {
            conn: self.write().acquire().await?,
            committed: false,
        };
        let result = Self::commit_in(&mut batch_tx.conn, batch).await?;
        batch_tx.committed = true;
        Ok(result)
    }
}

/// The writer's connection while a batch's transaction may be open on it: closed when dropped
/// before the batch committed.
struct Unfinished {
    conn: PoolConnection<Sqlite>,
    committed: bool,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.committed {
            self.conn.close_on_drop();
        }
    }
}

/// Begins the batch's transaction (`BEGIN IMMEDIATE`: the write lock up front), records
/// `attempts` and inserts `claims`, in one query; returns what [`push_insert_claims`] does.
async fn begin_with_claims(
    conn: &mut SqliteConnection,
    attempts: &[&AttemptRecord],
    claims: &[&Claim],
) -> Result<Vec<(Uuid, Vec<u8>, Uuid)>, sqlx::Error> {
    let mut q = QueryBuilder::<Sqlite>::new("BEGIN IMMEDIATE; ");
    push_record_attempts(&mut q, attempts);
    if claims.is_empty() {
        q.build().execute(conn).await?;
        return Ok(Vec::new());
    }
    push_insert_claims(&mut q, claims);
    q.build_query_as().fetch_all(conn).await
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
