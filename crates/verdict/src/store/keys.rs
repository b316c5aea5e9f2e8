//! Idempotency keys: the claim's slow path (a key that already has a row), the lock's release,
//! pruning, and the pure judgement of an existing row against SPEC §3's state table.
//!
//! The fast path, a fresh key, is a row of the group commit's multi-row insert
//! ([`super::pipeline`]).

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};
pub use crate::domain::KeyState;
use crate::domain::SignalAnswer;

/// The primary key of an idempotency row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KeyRef {
    pub tenant_id: Uuid,
    pub endpoint: &'static str,
    pub digest: Vec<u8>,
}

/// A request to claim a key, with the lock it takes and the decision it records if it wins.
#[derive(Clone, Debug)]
pub struct Claim {
    pub key: KeyRef,
    pub fingerprint: Vec<u8>,
    pub event_id: Uuid,
    pub lock_token: Uuid,
    pub now: i64,
    pub locked_until: i64,
    pub expires_at: i64,
    /// The decision (JSON), frozen with the claim: the only one this key will ever have.
    pub ruling: String,
}

/// A response stored on a completed key, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Where a taken-over row stood when its holder died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryPoint {
    /// Claimed with this decision (absent on rows claimed before decisions were recorded).
    InFlight { ruling: Option<String> },
    /// A v1 row whose effects ran; their results (JSON) carry its decision.
    Dispatched { action_results: String },
    /// Its act committed and its connector calls went out, unanswered or unrecorded: the
    /// response stored with the act (those calls `pending`) is completed with their outcomes.
    Calling { response: StoredResponse },
}

/// What a claim found; each arm is the handler's next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// We inserted the row: process from the start with our event id and decision.
    Started,
    /// The holder's lock had expired and we took the row over with our lock token.
    TakenOver {
        event_id: Uuid,
        from: RecoveryPoint,
        /// The row's own expiry, which a takeover does not extend.
        expires_at: i64,
    },
    /// Someone holds a fresh lock: 409.
    InProgress,
    /// The key was used with another payload: 422.
    Mismatch,
    /// Completed earlier: replay; the row stays as it is until `expires_at`.
    Completed {
        response: StoredResponse,
        expires_at: i64,
    },
}

/// What one batch of expired keys deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrunedKeys {
    pub deleted: u64,
    /// The latest expiry among them.
    pub reached: Option<i64>,
    /// The earliest expiry before `reached` at which a key is left (one updated between the
    /// batch's pick and its delete): where the sweep must come back to.
    pub left: Option<i64>,
}

/// An existing key row, as a claim that lost the insert reads it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ExistingKey {
    pub fingerprint: Vec<u8>,
    pub state: String,
    pub event_id: Uuid,
    pub lock_token: Option<Uuid>,
    pub locked_until: i64,
    pub ruling: Option<String>,
    pub action_results: Option<String>,
    pub response_status: Option<i32>,
    pub response_body: Option<Vec<u8>>,
    pub expires_at: i64,
    /// Its event's columns where the key keeps no response bytes (NULL where it does, or
    /// where its event is not stored yet): a completed key's answer is rendered from them
    /// ([`SignalAnswer`]).
    pub event_subject_hash: Option<Vec<u8>>,
    pub event_decision: Option<String>,
    pub event_playbook_version: Option<i64>,
    pub event_rule: Option<String>,
    pub event_actions: Option<String>,
}

impl ExistingKey {
    /// The answer a completed key without response bytes replays: its event's 200.
    fn answer_from_event(&self) -> Result<Vec<u8>, StoreError> {
        let (Some(subject_hash), Some(decision), Some(playbook_version), Some(rule), Some(actions)) = (
            &self.event_subject_hash,
            &self.event_decision,
            self.event_playbook_version,
            &self.event_rule,
            &self.event_actions,
        ) else {
            return Err(StoreError::Corrupt(
                "a completed key without a response has no event".into(),
            ));
        };
        SignalAnswer {
            event_id: self.event_id,
            subject_hash,
            decision: decision
                .parse()
                .map_err(|e| StoreError::Corrupt(Box::new(e)))?,
            playbook_version,
            rule,
            actions,
        }
        .render()
        .map_err(|e| StoreError::Corrupt(Box::new(e)))
    }
}

/// What to do about a row a claim found; shared by both backends so they judge alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// The row outlived its key lifetime: delete it and insert afresh.
    Expired,
    /// The answer is known without another statement.
    Final(ClaimOutcome),
    /// The holder's lock expired: compare-and-set on the state and token read, then resume.
    TakeOver {
        state: KeyState,
        token: Option<Uuid>,
        from: RecoveryPoint,
    },
}

/// Judges an existing row at `now` for a claim with `fingerprint`: SPEC §3's state table.
pub fn judge(row: ExistingKey, fingerprint: &[u8], now: i64) -> Result<Judgement, StoreError> {
    if row.expires_at <= now {
        return Ok(Judgement::Expired);
    }
    if row.fingerprint != fingerprint {
        return Ok(Judgement::Final(ClaimOutcome::Mismatch));
    }
    let state: KeyState = row
        .state
        .parse()
        .map_err(|e| StoreError::Corrupt(Box::new(e)))?;
    Ok(match state {
        KeyState::Completed => {
            let Some(status) = row.response_status else {
                return Err(StoreError::Corrupt(
                    "a completed key has no response".into(),
                ));
            };
            let body = match row.response_body {
                Some(body) => body,
                None => row.answer_from_event()?,
            };
            Judgement::Final(ClaimOutcome::Completed {
                response: StoredResponse {
                    status: u16::try_from(status).unwrap_or(500),
                    body,
                },
                expires_at: row.expires_at,
            })
        }
        _ if row.locked_until > now => Judgement::Final(ClaimOutcome::InProgress),
        KeyState::Dispatched => Judgement::TakeOver {
            state,
            token: row.lock_token,
            from: match (row.action_results, row.response_status, row.response_body) {
                (Some(action_results), _, _) => RecoveryPoint::Dispatched { action_results },
                (None, Some(status), Some(body)) => RecoveryPoint::Calling {
                    response: StoredResponse {
                        status: u16::try_from(status).unwrap_or(500),
                        body,
                    },
                },
                (None, _, _) => {
                    return Err(StoreError::Corrupt(
                        "a dispatched key has neither results nor a response".into(),
                    ));
                }
            },
        },
        KeyState::InFlight => Judgement::TakeOver {
            state,
            token: row.lock_token,
            from: RecoveryPoint::InFlight { ruling: row.ruling },
        },
    })
}

/// How many times a claim re-reads a row that changed under it before answering 409.
pub(crate) const CLAIM_ATTEMPTS: usize = 4;

/// Idempotency keys outside the group commit.
#[async_trait]
pub trait KeyStore {
    /// Claims a key on its own: inserts it, or judges the row that holds it and, when its
    /// holder died, takes it over.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError>;
    /// Releases our lock (the row stays at its recovery point, our token on it).
    async fn release(&self, key: &KeyRef, lock_token: Uuid) -> Result<(), StoreError>;
    /// Completes a held key with a final error response and no event.
    async fn complete_failed(
        &self,
        key: &KeyRef,
        lock_token: Uuid,
        response: &StoredResponse,
    ) -> Result<(), StoreError>;
    /// Deletes up to `limit` keys whose lifetime ended at `from` or later (and by `now`),
    /// soonest-expired first.
    async fn prune_expired_keys(
        &self,
        from: i64,
        now: i64,
        limit: i64,
    ) -> Result<PrunedKeys, StoreError>;
    /// Completes a dispatched signal once its connector calls answered, in one transaction:
    /// its event's action outcomes (`actions`, JSON) and, when it has a key whose lock is
    /// still `held`'s, the key with its final response.
    async fn complete_dispatched(
        &self,
        event_id: Uuid,
        actions: &str,
        held: Option<&crate::store::HeldKey>,
        response: &StoredResponse,
    ) -> Result<(), StoreError>;
}

/// Inserts claims that are new, in one statement; returns the keys it inserted, each with
/// the lock token of the claim that inserted it.
pub(crate) async fn insert_claims<DB, C>(
    conn: &mut C,
    claims: &[&crate::store::Claim],
) -> Result<Vec<(uuid::Uuid, Vec<u8>, uuid::Uuid)>, sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = sqlx::QueryBuilder::<DB>::new("");
    push_insert_claims(&mut q, claims);
    q.build_query_as().fetch_all(conn).await
}

/// Adds to `q` the statement of [`insert_claims`], which returns (tenant, digest, lock token)
/// of each key it inserted; `claims` is not empty.
pub(crate) fn push_insert_claims<DB: SqlDb>(
    q: &mut sqlx::QueryBuilder<DB>,
    claims: &[&crate::store::Claim],
) where
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Type<DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
{
    // One lock order across concurrent batches.
    let mut claims = claims.to_vec();
    claims.sort_by(|a, b| (a.key.tenant_id, &a.key.digest).cmp(&(b.key.tenant_id, &b.key.digest)));
    q.push(
        "INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, fingerprint, \
         state, event_id, lock_token, locked_until, created_at, expires_at, ruling) ",
    );
    q.push_values(claims, |mut row, c| {
        row.push_bind(c.key.tenant_id)
            .push_bind(c.key.endpoint)
            .push_bind(c.key.digest.clone())
            .push_bind(c.fingerprint.clone())
            .push_bind(crate::store::KeyState::InFlight.as_str())
            .push_bind(c.event_id)
            .push_bind(c.lock_token)
            .push_bind(c.locked_until)
            .push_bind(c.now)
            .push_bind(c.expires_at)
            .push_bind(c.ruling.clone());
    });
    q.push(" ON CONFLICT DO NOTHING RETURNING tenant_id, key_digest, lock_token");
}

/// Reads the row a claim conflicted with, through the write pool: on SQLite a
/// reader could hold a snapshot older than the row.
async fn existing_key<DB: SqlDb>(
    pool: &sqlx::Pool<DB>,
    key: &crate::store::KeyRef,
) -> Result<Option<crate::store::keys::ExistingKey>, sqlx::Error>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    sqlx::query_as(
        "SELECT k.fingerprint, k.state, k.event_id, k.lock_token, k.locked_until, k.ruling, \
         k.action_results, k.response_status, k.response_body, k.expires_at, \
         e.subject_hash AS event_subject_hash, e.decision AS event_decision, \
         e.playbook_version AS event_playbook_version, e.rule AS event_rule, \
         e.actions AS event_actions \
         FROM idempotency_keys k \
         LEFT JOIN events e ON k.response_body IS NULL AND e.id = k.event_id \
         WHERE k.tenant_id = $1 AND k.endpoint = $2 AND k.key_digest = $3",
    )
    .bind(key.tenant_id)
    .bind(key.endpoint)
    .bind(&key.digest)
    .fetch_optional(pool)
    .await
}
/// Completes dispatched signals: each event's action outcomes and each key still held by the
/// request that dispatched it (or took it over), with its final response.
pub(crate) async fn complete_calls_in<DB, C>(
    conn: &mut C,
    done: &[crate::store::CallsDone],
) -> Result<(), sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'e> Uuid: Encode<'e, DB> + Type<DB>,
    for<'e> i32: Encode<'e, DB> + Type<DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    for d in done {
        sqlx::query("UPDATE events SET actions = $2 WHERE id = $1")
            .bind(d.event_id)
            .bind(d.actions.as_str())
            .execute(&mut *conn)
            .await?;
        if let Some(held) = &d.held {
            sqlx::query(
                "UPDATE idempotency_keys SET state = 'completed', response_status = $5, \
                 response_body = $6, lock_token = NULL, locked_until = 0 \
                 WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                 AND lock_token = $4 AND state = 'dispatched'",
            )
            .bind(held.key.tenant_id)
            .bind(held.key.endpoint)
            .bind(&held.key.digest[..])
            .bind(held.lock_token)
            .bind(i32::from(d.response.status))
            .bind(&d.response.body[..])
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> KeyStore for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    async fn claim(
        &self,
        claim: &crate::store::Claim,
    ) -> Result<crate::store::ClaimOutcome, crate::store::StoreError> {
        use crate::store::ClaimOutcome;
        use crate::store::keys::Judgement;
        // The slow path of a claim that found its key taken: a retry after a 503 comes here,
        // and must meet a silent database with a 503 too, not wait on it.
        crate::store::answered_within(B::ANSWER_DEADLINE, async {
            let key = &claim.key;
            for _ in 0..crate::store::keys::CLAIM_ATTEMPTS {
                let mut conn = self.write().acquire().await?;
                if !insert_claims(&mut conn, &[claim]).await?.is_empty() {
                    return Ok(ClaimOutcome::Started);
                }
                drop(conn);
                let Some(row) = existing_key(self.write(), key).await? else {
                    continue; // pruned between our two statements
                };
                let (event_id, expires_at) = (row.event_id, row.expires_at);
                match crate::store::judge(row, &claim.fingerprint, claim.now)? {
                    Judgement::Final(outcome) => return Ok(outcome),
                    Judgement::Expired => {
                        sqlx::query(
                            "DELETE FROM idempotency_keys WHERE tenant_id = $1 \
                             AND endpoint = $2 AND key_digest = $3 AND expires_at <= $4",
                        )
                        .bind(key.tenant_id)
                        .bind(key.endpoint)
                        .bind(&key.digest)
                        .bind(claim.now)
                        .execute(self.write())
                        .await?;
                    }
                    Judgement::TakeOver { state, token, from } => {
                        // Compare-and-set on exactly what was read: of several takers one
                        // wins, and a holder that finished meanwhile changed the state.
                        let taken = sqlx::query(
                            "UPDATE idempotency_keys SET lock_token = $4, locked_until = $5 \
                             WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                             AND state = $6 AND locked_until <= $8 \
                             AND (lock_token = $7 OR (lock_token IS NULL AND $7 IS NULL))",
                        )
                        .bind(key.tenant_id)
                        .bind(key.endpoint)
                        .bind(&key.digest)
                        .bind(claim.lock_token)
                        .bind(claim.locked_until)
                        .bind(state.as_str())
                        .bind(token)
                        .bind(claim.now)
                        .execute(self.write())
                        .await?;
                        if DB::rows_affected(&taken) == 1 {
                            return Ok(ClaimOutcome::TakenOver {
                                event_id,
                                from,
                                expires_at,
                            });
                        }
                        // Someone changed the row since we read it: judge it again.
                    }
                }
            }
            Ok::<_, crate::store::StoreError>(ClaimOutcome::InProgress)
        })
        .await
    }

    async fn release(
        &self,
        key: &crate::store::KeyRef,
        lock_token: uuid::Uuid,
    ) -> Result<(), crate::store::StoreError> {
        sqlx::query(
            "UPDATE idempotency_keys SET locked_until = 0 \
             WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
             AND lock_token = $4 AND state <> 'completed'",
        )
        .bind(key.tenant_id)
        .bind(key.endpoint)
        .bind(&key.digest)
        .bind(lock_token)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn complete_dispatched(
        &self,
        event_id: uuid::Uuid,
        actions: &str,
        held: Option<&crate::store::HeldKey>,
        response: &crate::store::StoredResponse,
    ) -> Result<(), crate::store::StoreError> {
        let done = crate::store::CallsDone {
            event_id,
            actions: actions.to_owned(),
            held: held.cloned(),
            response: response.clone(),
        };
        let mut tx = self.begin().await?;
        complete_calls_in(&mut *tx, &[done]).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn complete_failed(
        &self,
        key: &crate::store::KeyRef,
        lock_token: uuid::Uuid,
        response: &crate::store::StoredResponse,
    ) -> Result<(), crate::store::StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET state = 'completed', response_status = $5, \
             response_body = $6, lock_token = NULL, locked_until = 0 \
             WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
             AND lock_token = $4 AND state <> 'completed'",
        )
        .bind(key.tenant_id)
        .bind(key.endpoint)
        .bind(&key.digest)
        .bind(lock_token)
        .bind(i32::from(response.status))
        .bind(&response.body)
        .execute(self.write())
        .await?;
        if DB::rows_affected(&done) != 1 {
            return Err(crate::store::StoreError::LockLost);
        }
        Ok(())
    }

    async fn prune_expired_keys(
        &self,
        from: i64,
        now: i64,
        limit: i64,
    ) -> Result<PrunedKeys, crate::store::StoreError> {
        // Bounded, so one statement never holds the writer (SQLite's only one) for long however
        // many keys expired at once; `idempotency_keys_by_expiry` finds them and their
        // addresses find the rows, not a probe of the random-ordered primary key each.
        let sql = format!(
            "DELETE FROM idempotency_keys WHERE {} RETURNING expires_at",
            DB::address_in(&format!(
                "SELECT {} FROM idempotency_keys WHERE expires_at >= $3 AND expires_at <= $1 \
                 ORDER BY expires_at LIMIT $2",
                DB::ROW_ADDRESS
            ))
        );
        let mut tx = self.begin_generic().await?;
        let expired: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(now)
            .bind(limit)
            .bind(from)
            .fetch_all(&mut *tx)
            .await?;
        let reached = expired.iter().max().copied();
        let left = match reached {
            Some(reached) => {
                sqlx::query_scalar(
                    "SELECT MIN(expires_at) FROM idempotency_keys \
                     WHERE expires_at >= $1 AND expires_at < $2",
                )
                .bind(from)
                .bind(reached)
                .fetch_one(&mut *tx)
                .await?
            }
            None => None,
        };
        tx.commit().await?;
        Ok(PrunedKeys {
            deleted: expired.len() as u64,
            reached,
            left,
        })
    }
}
