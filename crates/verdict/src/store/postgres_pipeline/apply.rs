//! [`APPLY`]: most of a batch in one statement.

use sqlx::PgConnection;
use sqlx::Row;
use uuid::Uuid;

use super::arrays::{OutboxRow, PgQuery, bind_events, bind_outbox, bind_responses, column};
use super::{Found, index, kind_name};
use crate::actions::ActionKind;
use crate::store::{Act, AttemptRecord, Batch, Claim, StoreError, StoredResponse};

/// The held locks' re-check, the new claims, the live acts' effects, the inline attempts'
/// records, and the outbox rows, events and completions of the acts whose effects all came out
/// as expected. Returns one row per claim won (`claim`), per keyed act whose lock held
/// (`held`), per effect of a live act (its kind) and per act settled (`settled`), each with the
/// index of its claim or act and whether the effect is this signal's.
macro_rules! apply_statement {
    () => {
        r#"
WITH claim_in AS (
    -- The batch's claims: alone (`i`, their position among the claims) or with their act
    -- (`act`, its position among the acts, and the response it completes the key with).
    SELECT * FROM unnest($1::int4[], $2::uuid[], $3::text[], $4::bytea[], $5::bytea[],
        $6::uuid[], $7::uuid[], $8::int8[], $9::int8[], $10::int8[], $11::text[], $69::int4[],
        $70::int4[], $71::bytea[])
        AS c(i, tenant_id, endpoint, key_digest, fingerprint, event_id, lock_token,
             locked_until, now, expires_at, ruling, act, status, body)
), claimed AS (
    -- One lock order across concurrent batches: no deadlock cycle. A claim with its act is
    -- inserted completed, with the response its act expects: no later statement of this one
    -- could see the row to complete it. Its act goes ahead only if it won (`held`), and if
    -- the act comes out otherwise, `FINISH` stores the actual response in the same
    -- transaction (the row keeps its token for that; every lock check also asks for a state
    -- other than completed).
    INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, fingerprint, state,
        event_id, lock_token, locked_until, created_at, expires_at, ruling, response_status,
        response_body)
    SELECT tenant_id, endpoint, key_digest, fingerprint,
        CASE WHEN act IS NULL THEN 'in_flight' ELSE 'completed' END, event_id, lock_token,
        CASE WHEN act IS NULL THEN locked_until ELSE 0 END, now, expires_at, ruling, status,
        body
    FROM claim_in ORDER BY tenant_id, endpoint, key_digest, i
    ON CONFLICT DO NOTHING RETURNING lock_token
), act_in AS (
    SELECT * FROM unnest($12::int4[], $13::uuid[], $14::uuid[], $15::bytea[], $16::bytea[],
        $17::text[], $18::int8[], $19::bool[], $20::bool[], $21::bool[], $22::bool[],
        $23::bool[], $24::uuid[], $25::uuid[], $27::text[], $28::bytea[], $29::uuid[])
        AS a(i, tenant_id, event_id, subject_hash, signal_key, signal_type, now, lock, deny,
             ledger, open_case, alert, ledger_id, case_id, endpoint, key_digest, lock_token)
), held_before AS (
    -- The keyed acts whose lock is still theirs (token and state), each key row locked for
    -- the rest of the transaction. Locked, not written: `completed` below writes the row, and
    -- one statement may write a row only once.
    SELECT a.i FROM act_in a
    JOIN idempotency_keys k ON k.tenant_id = a.tenant_id AND k.endpoint = a.endpoint
        AND k.key_digest = a.key_digest
    WHERE a.lock_token IS NOT NULL AND k.lock_token = a.lock_token AND k.state <> 'completed'
    FOR UPDATE OF k
), held AS (
    -- ... and the acts whose claim this statement inserted.
    SELECT i FROM held_before
    UNION ALL SELECT c.act FROM claimed JOIN claim_in c ON c.lock_token = claimed.lock_token
    WHERE c.act IS NOT NULL
), live AS (
    -- The acts that go ahead: the keyless ones and those whose lock held.
    SELECT * FROM act_in WHERE lock_token IS NULL OR i IN (SELECT i FROM held)
), attempt_in AS (
    SELECT * FROM unnest($30::uuid[], $31::uuid[], $32::int8[], $33::text[], $34::int4[],
        $35::int8[], $36::text[], $37::bytea[], $38::text[], $39::int8[], $40::int8[])
        AS t(id, delivery_id, attempted_at, trigger_kind, status_code, latency_ms, error,
             excerpt, status, retries_left, next_attempt_at)
), attempt_ins AS (
    INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, status_code,
        latency_ms, error, response_excerpt)
    SELECT id, delivery_id, attempted_at, trigger_kind, status_code, latency_ms, error, excerpt
    FROM attempt_in
), attempt_moved AS (
    -- Each delivery moves on with its attempt.
    UPDATE deliveries d SET status = t.status, attempts = d.attempts + 1,
        retries_left = t.retries_left, next_attempt_at = t.next_attempt_at, leased_until = 0,
        last_error = t.error, updated_at = t.attempted_at
    FROM attempt_in t WHERE d.id = t.delivery_id
), lock_ins AS (
    INSERT INTO account_locks (tenant_id, subject_hash, event_id, locked_at)
    SELECT DISTINCT ON (tenant_id, subject_hash) tenant_id, subject_hash, event_id, now
    FROM live WHERE lock ORDER BY tenant_id, subject_hash, i
    ON CONFLICT DO NOTHING RETURNING tenant_id, subject_hash, event_id
), deny_ins AS (
    INSERT INTO denies (tenant_id, subject_hash, event_id, issued_at)
    SELECT DISTINCT ON (tenant_id, subject_hash) tenant_id, subject_hash, event_id, now
    FROM live WHERE deny ORDER BY tenant_id, subject_hash, i
    ON CONFLICT DO NOTHING RETURNING tenant_id, subject_hash, event_id
), ledger_ins AS (
    INSERT INTO ledger_entries (tenant_id, signal_key, event_id, created_at, id, subject_hash,
        kind)
    SELECT DISTINCT ON (tenant_id, signal_key) tenant_id, signal_key, event_id, now, ledger_id,
        subject_hash, 'step_up_verification'
    FROM live WHERE ledger ORDER BY tenant_id, signal_key, i
    ON CONFLICT DO NOTHING RETURNING tenant_id, signal_key, event_id
), case_ins AS (
    INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, opened_at)
    SELECT DISTINCT ON (tenant_id, subject_hash) case_id, tenant_id, subject_hash, 'open',
        event_id, now
    FROM live WHERE open_case ORDER BY tenant_id, subject_hash, i
    ON CONFLICT DO NOTHING RETURNING id, tenant_id, subject_hash, opened_by_event
), case_of AS (
    -- The case this statement opened for the subject, else the open one already there.
    SELECT a.i, a.event_id, a.now,
        COALESCE(c.id, (SELECT x.id FROM cases x WHERE x.tenant_id = a.tenant_id
            AND x.subject_hash = a.subject_hash AND x.status = 'open')) AS case_id,
        COALESCE(c.opened_by_event, (SELECT x.opened_by_event FROM cases x
            WHERE x.tenant_id = a.tenant_id AND x.subject_hash = a.subject_hash
            AND x.status = 'open')) AS opener
    FROM live a
    LEFT JOIN case_ins c ON c.tenant_id = a.tenant_id AND c.subject_hash = a.subject_hash
    WHERE a.open_case
), case_attached AS (
    INSERT INTO case_events (case_id, event_id, attached_at)
    SELECT case_id, event_id, now FROM case_of WHERE case_id IS NOT NULL
    ORDER BY case_id, event_id
    ON CONFLICT DO NOTHING
), alert_ins AS (
    -- Claims each subject's alert window: inserted, or moved to this event once it expired.
    INSERT INTO alert_windows (tenant_id, subject_hash, signal_type, event_id, last_sent_at)
    SELECT DISTINCT ON (tenant_id, subject_hash, signal_type) tenant_id, subject_hash,
        signal_type, event_id, now
    FROM live WHERE alert ORDER BY tenant_id, subject_hash, signal_type, i
    ON CONFLICT (tenant_id, subject_hash, signal_type) DO UPDATE
        SET event_id = excluded.event_id, last_sent_at = excluded.last_sent_at
        WHERE alert_windows.last_sent_at <= excluded.last_sent_at - $26
    RETURNING tenant_id, subject_hash, signal_type, event_id
), alert_of AS (
    SELECT a.i, a.tenant_id, a.subject_hash, a.signal_type, a.event_id, a.now,
        COALESCE(COALESCE(w.event_id, (SELECT x.event_id FROM alert_windows x
            WHERE x.tenant_id = a.tenant_id AND x.subject_hash = a.subject_hash
            AND x.signal_type = a.signal_type)) = a.event_id, FALSE) AS ours
    FROM live a
    LEFT JOIN alert_ins w ON w.tenant_id = a.tenant_id AND w.subject_hash = a.subject_hash
        AND w.signal_type = a.signal_type
    WHERE a.alert
), alert_sent AS (
    INSERT INTO alerts (tenant_id, subject_hash, signal_type, event_id, sent_at)
    SELECT tenant_id, subject_hash, signal_type, event_id, now FROM alert_of WHERE ours
    ON CONFLICT DO NOTHING
), expected AS (
    -- The live acts whose every effect this statement wrote for them: their outbox row, event
    -- and response were built, before it ran, with every effect done.
    SELECT a.i FROM live a
    WHERE (NOT a.lock OR EXISTS (SELECT 1 FROM lock_ins l WHERE l.tenant_id = a.tenant_id
            AND l.subject_hash = a.subject_hash AND l.event_id = a.event_id))
        AND (NOT a.deny OR EXISTS (SELECT 1 FROM deny_ins d WHERE d.tenant_id = a.tenant_id
            AND d.subject_hash = a.subject_hash AND d.event_id = a.event_id))
        AND (NOT a.ledger OR EXISTS (SELECT 1 FROM ledger_ins l
            WHERE l.tenant_id = a.tenant_id AND l.signal_key = a.signal_key
            AND l.event_id = a.event_id))
        AND (NOT a.open_case OR EXISTS (SELECT 1 FROM case_ins c
            WHERE c.tenant_id = a.tenant_id AND c.subject_hash = a.subject_hash
            AND c.opened_by_event = a.event_id))
        AND (NOT a.alert OR EXISTS (SELECT 1 FROM alert_ins w WHERE w.tenant_id = a.tenant_id
            AND w.subject_hash = a.subject_hash AND w.signal_type = a.signal_type
            AND w.event_id = a.event_id))
), outbox_in AS (
    SELECT * FROM unnest($41::int4[], $42::uuid[], $43::uuid[], $44::uuid[], $45::bytea[],
        $46::text[], $47::bytea[], $48::int8[], $49::int8[])
        AS o(i, id, tenant_id, event_id, signal_key, webhook_id, payload, now, leased_until)
), outbox_ins AS (
    INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
        attempts, next_attempt_at, leased_until, created_at, updated_at)
    SELECT id, tenant_id, event_id, signal_key, webhook_id, payload, 'pending', 0, now,
        leased_until, now, now
    FROM outbox_in WHERE i IN (SELECT i FROM expected) ORDER BY tenant_id, signal_key, i
    ON CONFLICT DO NOTHING RETURNING id
), settled AS (
    -- Of those, the ones with no callback or whose outbox row this statement inserted: their
    -- expected outcomes are their actual ones, so they are finished here.
    SELECT e.i FROM expected e
    WHERE NOT EXISTS (SELECT 1 FROM outbox_in o WHERE o.i = e.i)
        OR EXISTS (SELECT 1 FROM outbox_in o JOIN outbox_ins x ON x.id = o.id WHERE o.i = e.i)
), event_ins AS (
    INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, attributes,
        metadata, decision, playbook_version, rule, actions, created_at, evaluated_at, facts,
        feed)
    SELECT id, tenant_id, signal_type, subject_hash, observed_at, attributes, metadata,
        decision, playbook_version, rule, actions, created_at, evaluated_at, facts, feed
    FROM unnest($50::int4[], $51::uuid[], $52::uuid[], $53::text[], $54::bytea[], $55::int8[],
        $56::text[], $57::text[], $58::text[], $59::int8[], $60::text[], $61::text[],
        $62::int8[], $63::int8[], $64::text[], $65::text[])
        AS e(i, id, tenant_id, signal_type, subject_hash, observed_at, attributes, metadata,
             decision, playbook_version, rule, actions, created_at, evaluated_at, facts, feed)
    WHERE i IN (SELECT i FROM settled)
    ON CONFLICT DO NOTHING
), completed AS (
    UPDATE idempotency_keys k SET state = 'completed', response_status = r.status,
        response_body = r.body, lock_token = NULL, locked_until = 0
    FROM unnest($66::int4[], $67::int4[], $68::bytea[]) AS r(i, status, body)
    JOIN act_in a ON a.i = r.i
    WHERE r.i IN (SELECT i FROM settled) AND k.tenant_id = a.tenant_id
        AND k.endpoint = a.endpoint AND k.key_digest = a.key_digest
        AND k.lock_token = a.lock_token
)
SELECT 'claim' AS kind, c.i, TRUE AS ours
    FROM claimed JOIN claim_in c ON c.lock_token = claimed.lock_token WHERE c.i IS NOT NULL
UNION ALL SELECT 'held', i, TRUE FROM held
UNION ALL SELECT 'lock', a.i, COALESCE(COALESCE(l.event_id, (SELECT x.event_id
        FROM account_locks x WHERE x.tenant_id = a.tenant_id
        AND x.subject_hash = a.subject_hash)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN lock_ins l ON l.tenant_id = a.tenant_id AND l.subject_hash = a.subject_hash
    WHERE a.lock
UNION ALL SELECT 'deny', a.i, COALESCE(COALESCE(d.event_id, (SELECT x.event_id
        FROM denies x WHERE x.tenant_id = a.tenant_id
        AND x.subject_hash = a.subject_hash)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN deny_ins d ON d.tenant_id = a.tenant_id AND d.subject_hash = a.subject_hash
    WHERE a.deny
UNION ALL SELECT 'ledger', a.i, COALESCE(COALESCE(l.event_id, (SELECT x.event_id
        FROM ledger_entries x WHERE x.tenant_id = a.tenant_id
        AND x.signal_key = a.signal_key)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN ledger_ins l ON l.tenant_id = a.tenant_id AND l.signal_key = a.signal_key
    WHERE a.ledger
UNION ALL SELECT 'case', i, COALESCE(opener = event_id, FALSE) FROM case_of
UNION ALL SELECT 'alert', i, ours FROM alert_of
UNION ALL SELECT 'settled', i, TRUE FROM settled
"#
    };
}

/// [`apply_statement`], run inside the batch's transaction.
pub(in crate::store) const APPLY: &str = apply_statement!();

/// [`apply_statement`], run as a transaction of its own: it aborts, keeping nothing, unless
/// every act that went ahead was settled by it (`verdict_require_settled` raises SQLSTATE
/// [`UNSETTLED`] otherwise), since no later statement could finish the others.
pub(in crate::store) const APPLY_ALONE: &str = concat!(
    apply_statement!(),
    "UNION ALL SELECT 'guard', 0, verdict_require_settled(\n",
    "    (SELECT count(*) FROM live) - (SELECT count(*) FROM settled))\n"
);

/// The SQLSTATE [`APPLY_ALONE`] aborts with when a batch needs its actual outcomes stored.
pub(super) const UNSETTLED: &str = "VD001";

/// Runs [`APPLY`]: the held locks' re-check, the batch's claims, the effects of the acts
/// whose lock held (and the keyless ones), the inline attempts' records, and what the acts
/// whose effects all came out as their own store (each act's [`crate::store::Expected`]).
pub(in crate::store) async fn apply(
    conn: &mut PgConnection,
    batch: &Batch,
    statement: &'static str,
) -> Result<Found, StoreError> {
    let outbox_rows: Vec<OutboxRow> = batch
        .acts
        .iter()
        .enumerate()
        .filter_map(|(i, act)| {
            act.expected.delivery.as_ref().map(|delivery| OutboxRow {
                i: index(i),
                act,
                delivery,
            })
        })
        .collect();
    let events: Vec<_> = batch
        .acts
        .iter()
        .map(|a| &a.expected.finished.event)
        .collect();
    // The keyed acts, and the responses their keys replay.
    let (keyed, responses): (Vec<i32>, Vec<_>) = batch
        .acts
        .iter()
        .enumerate()
        .filter(|(_, act)| act.held.is_some())
        .map(|(i, act)| (index(i), &act.expected.finished.response))
        .unzip();
    let claims = ClaimRow::of(batch);
    let query = bind_claims(sqlx::query(statement), &claims);
    let query = bind_acts(query, &batch.acts, batch.alert_window_ms);
    let query = bind_attempts(query, &batch.attempts);
    let query =
        bind_outbox(query, &outbox_rows).bind((0..batch.acts.len()).map(index).collect::<Vec<_>>());
    let query = bind_events(query, &events).bind(keyed);
    let rows = bind_claims_acts(bind_responses(query, &responses), &claims)
        .fetch_all(&mut *conn)
        .await?;
    let mut found = Found::default();
    for row in rows {
        let (kind, i, ours): (String, i32, bool) =
            (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        match kind.as_str() {
            "claim" => {
                found.claims_won.insert(i);
            }
            "held" => {
                found.held.insert(i);
            }
            "settled" => {
                found.settled.insert(i);
            }
            "guard" => {}
            kind => {
                let kind = ActionKind::LOCAL
                    .into_iter()
                    .map(kind_name)
                    .find(|name| *name == kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown effect {kind}")))?;
                found.effects.insert((kind, i), ours);
            }
        }
    }
    Ok(found)
}

/// A claim as [`APPLY`] takes it: alone, at its position among the batch's claims, or with
/// its act, at the act's position, completing the key with the act's expected response.
struct ClaimRow<'a> {
    claim: &'a Claim,
    alone: Option<i32>,
    act: Option<(i32, &'a StoredResponse)>,
}

impl<'a> ClaimRow<'a> {
    fn of(batch: &'a Batch) -> Vec<Self> {
        let alone = batch.claims.iter().enumerate().map(|(i, claim)| Self {
            claim,
            alone: Some(index(i)),
            act: None,
        });
        let with_act = batch.acts.iter().enumerate().filter_map(|(i, act)| {
            act.claim.as_ref().map(|claim| Self {
                claim,
                alone: None,
                act: Some((index(i), &act.expected.finished.response)),
            })
        });
        alone.chain(with_act).collect()
    }
}

/// Binds the claims' eleven arrays (`$1`–`$11`).
fn bind_claims<'q>(query: PgQuery<'q>, claims: &[ClaimRow]) -> PgQuery<'q> {
    query
        .bind(column(claims, |c| c.alone))
        .bind(column(claims, |c| c.claim.key.tenant_id))
        .bind(column(claims, |c| c.claim.key.endpoint))
        .bind(column(claims, |c| c.claim.key.digest.clone()))
        .bind(column(claims, |c| c.claim.fingerprint.clone()))
        .bind(column(claims, |c| c.claim.event_id))
        .bind(column(claims, |c| c.claim.lock_token))
        .bind(column(claims, |c| c.claim.locked_until))
        .bind(column(claims, |c| c.claim.now))
        .bind(column(claims, |c| c.claim.expires_at))
        .bind(column(claims, |c| c.claim.ruling.clone()))
}

/// Binds the claims' acts and the responses they complete their keys with (`$69`–`$71`).
fn bind_claims_acts<'q>(query: PgQuery<'q>, claims: &[ClaimRow]) -> PgQuery<'q> {
    query
        .bind(column(claims, |c| c.act.map(|(i, _)| i)))
        .bind(column(claims, |c| c.act.map(|(_, r)| i32::from(r.status))))
        .bind(column(claims, |c| c.act.map(|(_, r)| r.body.clone())))
}

/// Binds the acts' arrays and the alert window (`$12`–`$29`).
fn bind_acts<'q>(query: PgQuery<'q>, acts: &[Act], alert_window_ms: i64) -> PgQuery<'q> {
    let wants = |action: ActionKind| -> Vec<bool> {
        acts.iter().map(|a| a.effects.contains(&action)).collect()
    };
    query
        .bind((0..acts.len()).map(index).collect::<Vec<_>>())
        .bind(column(acts, |a| a.target.tenant_id))
        .bind(column(acts, |a| a.target.event_id))
        .bind(column(acts, |a| a.target.subject_hash.clone()))
        .bind(column(acts, |a| a.target.signal_key.clone()))
        .bind(column(acts, |a| a.target.signal_type))
        .bind(column(acts, |a| a.target.now))
        .bind(wants(ActionKind::LockAccount))
        .bind(wants(ActionKind::Deny))
        .bind(wants(ActionKind::ChargeStepUp))
        .bind(wants(ActionKind::OpenCase))
        .bind(wants(ActionKind::AlertCustomer))
        .bind(column(acts, |_| Uuid::now_v7()))
        .bind(column(acts, |_| Uuid::now_v7()))
        .bind(alert_window_ms)
        .bind(column(acts, |a| a.held.as_ref().map(|h| h.key.endpoint)))
        .bind(column(acts, |a| {
            a.held.as_ref().map(|h| h.key.digest.clone())
        }))
        .bind(column(acts, |a| a.held.as_ref().map(|h| h.lock_token)))
}

/// Binds the inline attempts' eleven arrays (`$30`–`$40`).
fn bind_attempts<'q>(query: PgQuery<'q>, attempts: &[AttemptRecord]) -> PgQuery<'q> {
    query
        .bind(column(attempts, |t| t.id))
        .bind(column(attempts, |t| t.delivery_id))
        .bind(column(attempts, |t| t.attempted_at))
        .bind(column(attempts, |t| t.trigger))
        .bind(column(attempts, |t| t.status_code))
        .bind(column(attempts, |t| t.latency_ms))
        .bind(column(attempts, |t| t.error.clone()))
        .bind(column(attempts, |t| t.response_excerpt.clone()))
        .bind(column(attempts, |t| t.next.status.as_str()))
        .bind(column(attempts, |t| t.next.retries_left))
        .bind(column(attempts, |t| t.next.next_attempt_at))
}
