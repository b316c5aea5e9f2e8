//! The group commit's statements that PostgreSQL runs fused, in fewer round trips.
//!
//! The shared group commit ([`super::pipeline`]) runs each step as its own multi-row statement:
//! about fifteen round trips a batch, each a wake-up on both sides, and on a busy machine the
//! wake-ups, not the rows, were most of a batch's time. Here data-modifying CTEs fuse the steps
//! that need no answer in between, each statement taking its rows as arrays (one shape whatever
//! the batch size, so each is parsed and planned once per connection):
//!
//! 1. [`APPLY`]: the held locks' re-check, the new claims, every local effect of the acts that
//!    go ahead (with each effect's outcome) and the inline attempts' records;
//! 2. [`OUTBOX`]: the callbacks' outbox rows, whose envelopes need the effects' outcomes;
//! 3. [`FINISH`]: the events and the keys' completions, whose bodies need the callbacks'
//!    outcomes.
//!
//! A batch is `BEGIN`, these three and `COMMIT` ([`super::PostgresStore`]'s `PipelineStore`):
//! five round trips, where the shared statements take fifteen. The outcomes are those of the
//! shared statements: an effect is `Done` where this signal's event holds its row (inserted
//! now, or already there), else `AlreadyDone`. One difference: a row another transaction
//! committed after this statement began is not visible to its lookups, so it reads
//! `AlreadyDone` (it is not this event's) and, for a case, the event is not attached to that
//! case.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;
use uuid::Uuid;

use super::pipeline::{ActOutcome, Finished};
use super::{Act, Batch, HeldKey, NewDelivery, StoreError, StoredResponse};
use crate::actions::{ActionKind, Applied};

/// The held locks' re-check, the new claims, the live acts' effects and the inline attempts'
/// records. Returns one row per claim won (`claim`), per keyed act whose lock held (`held`)
/// and per effect of a live act (its kind), each with the index of its claim or act and
/// whether the effect is this signal's.
const APPLY: &str = r#"
WITH claim_in AS (
    SELECT * FROM unnest($1::int4[], $2::uuid[], $3::text[], $4::bytea[], $5::bytea[],
        $6::uuid[], $7::uuid[], $8::int8[], $9::int8[], $10::int8[], $11::text[])
        AS c(i, tenant_id, endpoint, key_digest, fingerprint, event_id, lock_token,
             locked_until, now, expires_at, ruling)
), claimed AS (
    -- One lock order across concurrent batches: no deadlock cycle.
    INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, fingerprint, state,
        event_id, lock_token, locked_until, created_at, expires_at, ruling)
    SELECT tenant_id, endpoint, key_digest, fingerprint, 'in_flight', event_id, lock_token,
        locked_until, now, expires_at, ruling
    FROM claim_in ORDER BY tenant_id, endpoint, key_digest, i
    ON CONFLICT DO NOTHING RETURNING lock_token
), act_in AS (
    SELECT * FROM unnest($12::int4[], $13::uuid[], $14::uuid[], $15::bytea[], $16::bytea[],
        $17::text[], $18::int8[], $19::bool[], $20::bool[], $21::bool[], $22::bool[],
        $23::bool[], $24::uuid[], $25::uuid[], $27::text[], $28::bytea[], $29::uuid[])
        AS a(i, tenant_id, event_id, subject_hash, signal_key, signal_type, now, lock, deny,
             ledger, open_case, alert, ledger_id, case_id, endpoint, key_digest, lock_token)
), held AS (
    -- The keyed acts whose lock is still theirs (token and state), each key row locked for
    -- the rest of the transaction.
    UPDATE idempotency_keys k SET locked_until = k.locked_until
    FROM act_in a
    WHERE a.lock_token IS NOT NULL AND k.tenant_id = a.tenant_id AND k.endpoint = a.endpoint
        AND k.key_digest = a.key_digest AND k.lock_token = a.lock_token
        AND k.state <> 'completed'
    RETURNING a.i
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
)
SELECT 'claim' AS kind, c.i, TRUE AS ours
    FROM claimed JOIN claim_in c ON c.lock_token = claimed.lock_token
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
"#;

/// The callbacks' outbox rows, one per signal: per row, whether this statement inserted it
/// (only then does the inline attempt go out) and whether this signal's event holds it.
const OUTBOX: &str = r#"
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

/// The live acts' events and the completions of their keys (with the responses the keys
/// replay), where the lock is still this request's.
const FINISH: &str = r#"
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

/// How a batch's transaction begins: planning for lookups by key, whatever the tables'
/// statistics say.
///
/// The array statements are planned once per connection and their plan kept (a generic plan).
/// Planned while the tables were small (a new database, before autovacuum first analyses it),
/// the cheapest plan reads a whole table, and it would be kept while the table grows. Only
/// index lookups are wanted here, so the other plans are turned off for this transaction.
pub(super) const BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; \
     SET LOCAL enable_mergejoin = off";

/// The kind name [`APPLY`] reports an action's outcome under.
fn kind_name(action: ActionKind) -> &'static str {
    match action {
        ActionKind::LockAccount => "lock",
        ActionKind::Deny => "deny",
        ActionKind::ChargeStepUp => "ledger",
        ActionKind::OpenCase => "case",
        ActionKind::AlertCustomer => "alert",
        ActionKind::Callback => "callback",
    }
}

/// What [`APPLY`] found: the claims won, the acts whose lock held, and each live act's
/// effects, by index.
#[derive(Default)]
pub(super) struct Found {
    claims_won: HashSet<i32>,
    held: HashSet<i32>,
    effects: HashMap<(&'static str, i32), bool>,
}

/// A batch position as the statements carry it (a batch holds at most a few hundred rows).
fn index(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// Whether act `i`'s held lock passed [`APPLY`]'s re-check.
pub(super) fn held(found: &Found, i: usize) -> bool {
    found.held.contains(&index(i))
}

/// Whether each claim inserted its key.
pub(super) fn claims_won(batch: &Batch, found: &Found) -> Vec<bool> {
    (0..batch.claims.len())
        .map(|i| found.claims_won.contains(&index(i)))
        .collect()
}

/// Each live act's local effects, in [`ActionKind::LOCAL`] order, as the shared path records
/// them.
pub(super) fn outcomes_of(batch: &Batch, live: &[usize], found: &Found) -> Vec<ActOutcome> {
    live.iter()
        .map(|&i| {
            let act = &batch.acts[i];
            let effects = ActionKind::LOCAL
                .into_iter()
                .filter(|action| act.effects.contains(action))
                .map(|action| {
                    let ours = found.effects.get(&(kind_name(action), index(i)));
                    let applied = if ours == Some(&true) {
                        Applied::Done
                    } else {
                        Applied::AlreadyDone
                    };
                    (action, applied)
                })
                .collect();
            ActOutcome {
                effects,
                ..ActOutcome::default()
            }
        })
        .collect()
}

/// Runs [`APPLY`]: the held locks' re-check, the batch's claims, the effects of the acts
/// whose lock held (and the keyless ones), and the inline attempts' records.
pub(super) async fn apply(conn: &mut PgConnection, batch: &Batch) -> Result<Found, StoreError> {
    let claims = &batch.claims;
    let acts = &batch.acts;
    let attempts = &batch.attempts;
    let wants = |action: ActionKind| -> Vec<bool> {
        acts.iter().map(|a| a.effects.contains(&action)).collect()
    };
    let rows: Vec<(String, i32, bool)> = sqlx::query_as(APPLY)
        .bind((0..claims.len()).map(index).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.key.tenant_id).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.key.endpoint).collect::<Vec<_>>())
        .bind(
            claims
                .iter()
                .map(|c| c.key.digest.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            claims
                .iter()
                .map(|c| c.fingerprint.clone())
                .collect::<Vec<_>>(),
        )
        .bind(claims.iter().map(|c| c.event_id).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.lock_token).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.locked_until).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.now).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.expires_at).collect::<Vec<_>>())
        .bind(claims.iter().map(|c| c.ruling.clone()).collect::<Vec<_>>())
        .bind((0..acts.len()).map(index).collect::<Vec<_>>())
        .bind(acts.iter().map(|a| a.target.tenant_id).collect::<Vec<_>>())
        .bind(acts.iter().map(|a| a.target.event_id).collect::<Vec<_>>())
        .bind(
            acts.iter()
                .map(|a| a.target.subject_hash.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            acts.iter()
                .map(|a| a.target.signal_key.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            acts.iter()
                .map(|a| a.target.signal_type)
                .collect::<Vec<_>>(),
        )
        .bind(acts.iter().map(|a| a.target.now).collect::<Vec<_>>())
        .bind(wants(ActionKind::LockAccount))
        .bind(wants(ActionKind::Deny))
        .bind(wants(ActionKind::ChargeStepUp))
        .bind(wants(ActionKind::OpenCase))
        .bind(wants(ActionKind::AlertCustomer))
        .bind(acts.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
        .bind(acts.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
        .bind(batch.alert_window_ms)
        .bind(
            acts.iter()
                .map(|a| a.held.as_ref().map(|h| h.key.endpoint))
                .collect::<Vec<_>>(),
        )
        .bind(
            acts.iter()
                .map(|a| a.held.as_ref().map(|h| h.key.digest.clone()))
                .collect::<Vec<_>>(),
        )
        .bind(
            acts.iter()
                .map(|a| a.held.as_ref().map(|h| h.lock_token))
                .collect::<Vec<_>>(),
        )
        .bind(attempts.iter().map(|t| t.id).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.delivery_id).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.attempted_at).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.trigger).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.status_code).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.latency_ms).collect::<Vec<_>>())
        .bind(attempts.iter().map(|t| t.error.clone()).collect::<Vec<_>>())
        .bind(
            attempts
                .iter()
                .map(|t| t.response_excerpt.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|t| t.next.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|t| t.next.retries_left)
                .collect::<Vec<_>>(),
        )
        .bind(
            attempts
                .iter()
                .map(|t| t.next.next_attempt_at)
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    let mut found = Found::default();
    for (kind, i, ours) in rows {
        match kind.as_str() {
            "claim" => {
                found.claims_won.insert(i);
            }
            "held" => {
                found.held.insert(i);
            }
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

/// Builds each live act's envelope from its effects and records the outbox rows; fills in the
/// callbacks' outcomes and returns the rows, per live act.
pub(super) async fn outbox(
    conn: &mut PgConnection,
    batch: &Batch,
    live: &[usize],
    outcomes: &mut [ActOutcome],
) -> Result<Vec<Option<NewDelivery>>, StoreError> {
    let deliveries: Vec<Option<NewDelivery>> = live
        .iter()
        .zip(outcomes.iter())
        .map(|(&i, o)| {
            batch.acts[i].callback.as_ref().map(|c| NewDelivery {
                id: c.id,
                webhook_id: c.webhook_id.clone(),
                payload: (c.envelope)(&o.effects),
                leased_until: c.leased_until,
            })
        })
        .collect();
    // (position among the live acts, its act, its row)
    let rows: Vec<(i32, &Act, &NewDelivery)> = live
        .iter()
        .zip(&deliveries)
        .enumerate()
        .filter_map(|(n, (&i, d))| d.as_ref().map(|d| (index(n), &batch.acts[i], d)))
        .collect();
    if rows.is_empty() {
        return Ok(deliveries);
    }
    let stored: Vec<(i32, bool, bool)> = sqlx::query_as(OUTBOX)
        .bind(rows.iter().map(|(n, _, _)| *n).collect::<Vec<_>>())
        .bind(rows.iter().map(|(_, _, d)| d.id).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|(_, a, _)| a.target.tenant_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, a, _)| a.target.event_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, a, _)| a.target.signal_key.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, _, d)| d.webhook_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, _, d)| d.payload.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, a, _)| a.target.now)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|(_, _, d)| d.leased_until)
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
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

/// Runs [`FINISH`]: stores the live acts' events and completes the keys still held with their
/// responses.
pub(super) async fn finish(
    conn: &mut PgConnection,
    finished: &[Finished],
    completions: &[(&HeldKey, &StoredResponse)],
) -> Result<(), StoreError> {
    let events: Vec<_> = finished.iter().map(|f| &f.event).collect();
    if events.is_empty() && completions.is_empty() {
        return Ok(());
    }
    sqlx::query(FINISH)
        .bind(events.iter().map(|e| e.id).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.tenant_id).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.signal_type).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.subject_hash.clone())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.observed_at).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.attributes.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            events
                .iter()
                .map(|e| e.metadata.clone())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.decision).collect::<Vec<_>>())
        .bind(
            events
                .iter()
                .map(|e| e.playbook_version)
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| e.rule.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.actions.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.created_at).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.evaluated_at).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.facts.clone()).collect::<Vec<_>>())
        .bind(events.iter().map(|e| e.feed).collect::<Vec<_>>())
        .bind(
            completions
                .iter()
                .map(|(h, _)| h.key.tenant_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .iter()
                .map(|(h, _)| h.key.endpoint)
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .iter()
                .map(|(h, _)| h.key.digest.clone())
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .iter()
                .map(|(h, _)| h.lock_token)
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .iter()
                .map(|(_, r)| i32::from(r.status))
                .collect::<Vec<_>>(),
        )
        .bind(
            completions
                .iter()
                .map(|(_, r)| r.body.clone())
                .collect::<Vec<_>>(),
        )
        .execute(&mut *conn)
        .await?;
    Ok(())
}
