//! [`apply()`]: most of a batch in one statement.

use std::sync::OnceLock;

use sqlx::PgConnection;
use sqlx::Row as _;

use super::effects::{self, EffectSet};
use super::inputs::{ActIn, ClaimIn, DispatchedKey, Settling};
use super::params::{Int8, Param, Rows, bind_all, render};
use super::{Found, index};
use crate::domain::ActionKind;
use crate::store::rows::{OutboxRow, RequestRow};
use crate::store::{Batch, NewEvent, StoreError};

/// The held locks' re-check, the new claims, the live acts' effects, the inline attempts'
/// records, the completions of dispatched signals whose calls answered, and the outbox rows, events and completions of the acts whose effects all came out
/// as expected. Returns one row per claim won (`claim`), per keyed act whose lock held
/// (`held`), per effect of a live act (its kind) and per act settled (`settled`), each with the
/// index of its claim or act and whether the effect is this signal's. Its inputs are named
/// `{…}` and rendered by [`render`] from [`Inputs`].
const TEMPLATE: &str = r#"
WITH claim_in AS (
    -- The batch's claims: alone (`i`, their position among the claims) or with their act
    -- (`act`, its position among the acts, and the response it completes the key with).
    SELECT * FROM {claim_rows}
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
        CASE WHEN act IS NULL THEN 'in_flight' ELSE state END, event_id, lock_token,
        CASE WHEN act IS NULL THEN locked_until ELSE act_locked_until END, now, expires_at,
        ruling, status, body
    FROM claim_in ORDER BY tenant_id, endpoint, key_digest, i
    ON CONFLICT DO NOTHING RETURNING lock_token
), act_in AS (
    SELECT * FROM {act_rows}
){held_before}
, held AS (
    -- The acts whose claim this statement inserted (and those whose held lock is still theirs).
    {held_before_rows}SELECT c.act AS i FROM claimed
    JOIN claim_in c ON c.lock_token = claimed.lock_token
    WHERE c.act IS NOT NULL
), live AS (
    -- The acts that go ahead: the keyless ones and those whose lock held.
    SELECT * FROM act_in WHERE lock_token IS NULL OR i IN (SELECT i FROM held)
){attempts}{calls}{effects}
, expected AS (
    -- The live acts whose every effect this statement wrote for them: their outbox row, event
    -- and response were built, before it ran, with every effect done.
    SELECT a.i FROM live a
    WHERE {effects_written}
), outbox_in AS (
    SELECT * FROM {outbox_rows}
), outbox_ins AS (
    INSERT INTO deliveries ({outbox_rows.columns})
    SELECT {outbox_rows.columns}
    FROM outbox_in WHERE i IN (SELECT i FROM expected)
    ORDER BY tenant_id, signal_key, endpoint_id, i
    ON CONFLICT DO NOTHING RETURNING id
){requests}
, settled AS (
    -- Of those, the ones whose every outbox row (one per endpoint) and every action request
    -- this statement inserted: their expected outcomes are their actual ones, so they are
    -- finished here.
    SELECT e.i FROM expected e
    WHERE NOT EXISTS (SELECT 1 FROM outbox_in o WHERE o.i = e.i
            AND NOT EXISTS (SELECT 1 FROM outbox_ins x WHERE x.id = o.id)){requests_settled}
), event_ins AS (
    -- Not `ON CONFLICT`: a speculative insert logs a confirmation record for every row (48 B
    -- a signal). An event's id is new with its claim or its keyless signal, and one batch
    -- carries it; the check still leaves out, as `DO NOTHING` did, a row already there.
    INSERT INTO events ({event_rows.columns})
    SELECT {event_rows.columns} FROM {event_rows}
    WHERE i IN (SELECT i FROM settled)
        AND NOT EXISTS (SELECT 1 FROM events x WHERE x.id = event_rows.id)
){completions}
SELECT 'claim' AS kind, c.i, TRUE AS ours
    FROM claimed JOIN claim_in c ON c.lock_token = claimed.lock_token WHERE c.i IS NOT NULL
UNION ALL SELECT 'held', i, TRUE FROM held
{effects_outcomes}UNION ALL SELECT 'settled', i, TRUE FROM settled
"#;

/// The held locks' re-check, in a batch with keyed acts that were claimed before it.
const HELD_BEFORE: &str = r#"
, held_before AS (
    -- The keyed acts whose lock is still theirs (token and state), each key row locked for
    -- the rest of the transaction. Locked, not written: `completed` below writes the row, and
    -- one statement may write a row only once.
    SELECT a.i FROM act_in a
    JOIN idempotency_keys k ON k.tenant_id = a.tenant_id AND k.endpoint = a.endpoint
        AND k.key_digest = a.key_digest
    WHERE a.lock_token IS NOT NULL AND k.lock_token = a.lock_token AND k.state <> 'completed'
    FOR UPDATE OF k
)"#;

/// What `held` adds for [`HELD_BEFORE`].
const HELD_BEFORE_ROWS: &str = "SELECT i FROM held_before\n    UNION ALL ";

/// The key completions of the held acts that settled, in a batch with such acts.
const COMPLETIONS: &str = r#"
, completed AS (
    -- Completed, or dispatched (still locked) while the act's connector calls are out.
    UPDATE idempotency_keys k SET state = responses.state, response_status = responses.status,
        response_body = responses.body,
        ruling = CASE WHEN responses.state = 'completed' THEN NULL ELSE k.ruling END,
        lock_token = CASE WHEN responses.state = 'completed' THEN NULL ELSE k.lock_token END,
        locked_until = CASE WHEN responses.state = 'completed' THEN 0
            ELSE responses.locked_until END
    FROM {responses}
    JOIN act_in a ON a.i = responses.i
    WHERE responses.i IN (SELECT i FROM settled) AND k.tenant_id = a.tenant_id
        AND k.endpoint = a.endpoint AND k.key_digest = a.key_digest
        AND k.lock_token = a.lock_token
)"#;

/// The attempts' records, in a batch with some.
const ATTEMPTS: &str = r#"
, attempt_in AS (
    SELECT * FROM {attempt_rows}
), attempt_ins AS (
    -- A record is sent again when the answer to the commit that stored it was lost (the
    -- connection cut after the commit): its row is there, and is neither stored again (a
    -- duplicate key would fail the whole batch it joined) nor moves its delivery on twice.
    -- An inline attempt (at most one per delivery) is no row: it is recorded on its
    -- delivery below, once.
    INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, status_code,
        latency_ms, error, response_excerpt)
    SELECT id, delivery_id, attempted_at, trigger_kind, status_code, latency_ms, error, excerpt
    FROM attempt_in WHERE trigger_kind <> 'inline'
    ON CONFLICT (id) DO NOTHING RETURNING id
), attempt_moved AS (
    -- Each delivery moves on with its attempt, once.
    -- An inline attempt that settled its delivery keeps its lease's end: that update then
    -- changes no indexed column and stays in place (postgres/0033).
    UPDATE deliveries d SET status = t.status, attempts = d.attempts + 1,
        retries_left = t.retries_left, next_attempt_at = t.next_attempt_at,
        leased_until = CASE WHEN t.trigger_kind = 'inline' AND t.status <> 'pending'
            THEN d.leased_until ELSE 0 END,
        sent_at = NULL, last_error = t.error, updated_at = t.attempted_at,
        payload = CASE WHEN d.action <> 'callback'
            AND t.status IN ('succeeded', 'failed', 'unknown')
            THEN substr(d.payload, 1, 0) ELSE d.payload END,
        inline_attempted_at = CASE WHEN t.trigger_kind = 'inline' THEN t.attempted_at
            ELSE d.inline_attempted_at END,
        inline_status_code = CASE WHEN t.trigger_kind = 'inline' THEN t.status_code
            ELSE d.inline_status_code END,
        inline_latency_ms = CASE WHEN t.trigger_kind = 'inline' THEN t.latency_ms
            ELSE d.inline_latency_ms END,
        inline_error = CASE WHEN t.trigger_kind = 'inline' THEN t.error
            ELSE d.inline_error END,
        inline_excerpt = CASE WHEN t.trigger_kind = 'inline' THEN t.excerpt
            ELSE d.inline_excerpt END
    FROM attempt_in t WHERE d.id = t.delivery_id
        AND (t.id IN (SELECT id FROM attempt_ins)
            OR (t.trigger_kind = 'inline' AND d.inline_attempted_at IS NULL))
)"#;

/// The completions of dispatched signals whose calls answered, in a batch that has some.
const CALLS: &str = r#"
, calls_recorded AS (
    -- Dispatched signals whose connector calls answered: their events' action outcomes ...
    UPDATE events e SET actions = calls_done_rows.actions FROM {calls_done_rows}
    WHERE e.id = calls_done_rows.event_id
), calls_completed AS (
    -- ... and their keys, where still held, completed with the final response.
    UPDATE idempotency_keys k SET state = 'completed', response_status = dispatched_keys.status,
        response_body = dispatched_keys.body, lock_token = NULL, locked_until = 0
    FROM {dispatched_keys}
    WHERE k.tenant_id = dispatched_keys.tenant_id AND k.endpoint = dispatched_keys.endpoint
        AND k.key_digest = dispatched_keys.key_digest
        AND k.lock_token = dispatched_keys.lock_token AND k.state = 'dispatched'
)"#;

/// The connector action requests of the acts, in a batch that has some.
const REQUESTS: &str = r#"
, request_in AS (
    SELECT * FROM {request_rows}
), request_ins AS (
    -- Their connector action requests (the `dispatched` recovery point's rows): one per
    -- signal and action.
    INSERT INTO deliveries ({request_rows.columns})
    SELECT {request_rows.columns}
    FROM request_in WHERE i IN (SELECT i FROM expected) ORDER BY tenant_id, signal_key, action, i
    ON CONFLICT DO NOTHING RETURNING id
)"#;

/// The condition [`REQUESTS`] adds to `settled`: every request of the act inserted.
const REQUESTS_SETTLED: &str = r#"
        AND NOT EXISTS (SELECT 1 FROM request_in r WHERE r.i = e.i
            AND NOT EXISTS (SELECT 1 FROM request_ins x WHERE x.id = r.id))"#;

/// What a batch's statement holds besides what every batch needs: the CTEs of the local
/// effects its acts ask for, and those of the held keys, the attempts' records and the
/// connector calls' rows when it has any. Every CTE of a statement is set up each time it
/// runs, whether it has rows or not, and that set-up (`standard_ExecutorStart` under `perf`)
/// was a sixth of the database's time per signal; at low concurrency, where a batch holds one
/// or two signals, each statement's fixed cost is most of the database's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    effects: EffectSet,
    /// Dispatched signals whose calls answered ([`CALLS`]).
    calls: bool,
    /// Connector action requests ([`REQUESTS`]).
    requests: bool,
    /// Acts on keys claimed before the batch ([`HELD_BEFORE`], [`COMPLETIONS`]).
    held: bool,
    /// Attempts' records ([`ATTEMPTS`]).
    attempts: bool,
}

impl Shape {
    /// How many shapes there are: one statement of each kind is rendered for each.
    const COUNT: usize = EffectSet::COUNT * 16;

    /// How many combinations of the parts besides the effects there are.
    const PARTS: usize = 16;

    fn of(batch: &Batch, inputs: &Inputs) -> Self {
        Self {
            effects: EffectSet::asked(batch.acts.iter().map(|act| &act.effects[..])),
            calls: !batch.calls_done.is_empty(),
            requests: !inputs.requests.is_empty(),
            held: !inputs.keyed.is_empty(),
            attempts: !batch.attempts.is_empty(),
        }
    }

    /// The parts besides the effects, one bit each.
    fn parts(self) -> usize {
        [self.calls, self.requests, self.held, self.attempts]
            .into_iter()
            .fold(0, |bits, part| bits * 2 + usize::from(part))
    }

    /// Its position among [`Self::all`].
    fn index(self) -> usize {
        self.effects.index() * Self::PARTS + self.parts()
    }

    /// Every shape, in [`Self::index`] order.
    #[cfg(test)]
    fn all() -> impl Iterator<Item = Self> {
        let bit = |parts: usize, n: u32| parts & (1 << n) != 0;
        EffectSet::all().flat_map(move |effects| {
            (0..Self::PARTS).map(move |parts| Self {
                effects,
                calls: bit(parts, 3),
                requests: bit(parts, 2),
                held: bit(parts, 1),
                attempts: bit(parts, 0),
            })
        })
    }

    /// [`TEMPLATE`] in this shape, with its placeholders for inputs still in it.
    fn template(self) -> String {
        let part = |present: bool, sql: &'static str| if present { sql } else { "" };
        effects::assemble(TEMPLATE, self.effects)
            .replacen("{calls}", part(self.calls, CALLS), 1)
            .replacen("{requests}", part(self.requests, REQUESTS), 1)
            .replacen(
                "{requests_settled}",
                part(self.requests, REQUESTS_SETTLED),
                1,
            )
            .replacen("{held_before}", part(self.held, HELD_BEFORE), 1)
            .replacen("{held_before_rows}", part(self.held, HELD_BEFORE_ROWS), 1)
            .replacen("{completions}", part(self.held, COMPLETIONS), 1)
            .replacen("{attempts}", part(self.attempts, ATTEMPTS), 1)
    }
}

/// [`TEMPLATE`] in `shape`: run inside the batch's transaction, or (`alone`) as a transaction
/// of its own, which aborts, keeping nothing, unless every act that went ahead was settled by
/// it (`verdict_require_settled` raises SQLSTATE [`UNSETTLED`] otherwise), since no later
/// statement could finish the others. Rendered once per shape and kind, when first needed.
fn statement(shape: Shape, alone: bool) -> &'static str {
    static RENDERED: [[OnceLock<String>; 2]; Shape::COUNT] =
        [const { [const { OnceLock::new() }, const { OnceLock::new() }] }; Shape::COUNT];
    RENDERED[shape.index()][usize::from(alone)].get_or_init(|| {
        let mut template = shape.template();
        if alone {
            template.push_str(
                "UNION ALL SELECT 'guard', 0, verdict_require_settled(\n    \
                 (SELECT count(*) FROM live) - (SELECT count(*) FROM settled))\n",
            );
        }
        Inputs::of(&Batch::default()).render(shape, &template)
    })
}

/// Every statement [`apply()`] may run: each shape, alone and not.
#[cfg(test)]
pub(in crate::store) fn every_statement() -> impl Iterator<Item = &'static str> {
    Shape::all().flat_map(|shape| [statement(shape, false), statement(shape, true)])
}

/// The SQLSTATE the statement run alone aborts with when a batch needs its actual outcomes stored.
pub(super) const UNSETTLED: &str = "VD001";

/// Everything [`TEMPLATE`] takes, as rows: built for a batch to bind it, and for an empty one
/// to render the statement (the text depends only on the row types).
struct Inputs<'a> {
    claims: Vec<ClaimIn<'a>>,
    acts: Vec<ActIn<'a>>,
    batch: &'a Batch,
    outbox: Vec<OutboxRow<'a>>,
    outbox_index: Vec<i32>,
    events: Vec<&'a NewEvent>,
    /// The acts on keys claimed before the batch, and what their keys become.
    keyed: Vec<i32>,
    responses: Vec<Settling<'a>>,
    /// Each act's connector action requests, under its position.
    requests: Vec<RequestRow<'a>>,
    requests_index: Vec<i32>,
    /// The dispatched keys still held whose calls answered.
    dispatched: Vec<DispatchedKey<'a>>,
}

impl<'a> Inputs<'a> {
    fn of(batch: &'a Batch) -> Self {
        let (outbox_index, outbox) = batch
            .acts
            .iter()
            .enumerate()
            .flat_map(|(i, act)| {
                act.expected.deliveries.iter().map(move |delivery| {
                    (
                        index(i),
                        OutboxRow {
                            target: &act.target,
                            delivery,
                        },
                    )
                })
            })
            .unzip();
        // A key claimed in this statement is inserted with its response already; no later
        // part of the statement could see it to complete it.
        let (keyed, responses) = batch
            .acts
            .iter()
            .enumerate()
            .filter(|(_, act)| act.held.is_some() && act.claim.is_none())
            .map(|(i, act)| (index(i), Settling(&act.expected.finished)))
            .unzip();
        let (requests_index, requests) = batch
            .acts
            .iter()
            .enumerate()
            .flat_map(|(i, act)| {
                act.requests_for(&act.expected.outcome.effects)
                    .into_iter()
                    .map(move |request| {
                        (
                            index(i),
                            RequestRow {
                                target: &act.target,
                                request,
                            },
                        )
                    })
            })
            .unzip();
        Self {
            claims: ClaimIn::of(batch),
            acts: ActIn::of(&batch.acts),
            batch,
            outbox,
            outbox_index,
            events: batch
                .acts
                .iter()
                .map(|a| &a.expected.finished.event)
                .collect(),
            keyed,
            responses,
            requests,
            requests_index,
            dispatched: batch
                .calls_done
                .iter()
                .filter_map(|d| {
                    Some(DispatchedKey {
                        held: d.held.as_ref()?,
                        response: &d.response,
                    })
                })
                .collect(),
        }
    }

    /// Runs `f` with the inputs of the statement in `shape`, in parameter order.
    fn with<T>(&self, shape: Shape, f: impl FnOnce(&[&dyn Param]) -> T) -> T {
        let events_index = (0..self.batch.acts.len()).map(index).collect();
        let claims = Rows::new("claim_rows", self.claims.iter().collect());
        let acts = Rows::new("act_rows", self.acts.iter().collect());
        // Only the alert's CTE reads its window.
        let alert_window = Int8("alert_window", self.batch.alert_window_ms);
        let attempts = Rows::new("attempt_rows", self.batch.attempts.iter().collect());
        let calls_done = Rows::new("calls_done_rows", self.batch.calls_done.iter().collect());
        let dispatched = Rows::new("dispatched_keys", self.dispatched.iter().collect());
        let outbox = Rows::indexed(
            "outbox_rows",
            self.outbox_index.clone(),
            self.outbox.iter().collect(),
        );
        let requests = Rows::indexed(
            "request_rows",
            self.requests_index.clone(),
            self.requests.iter().collect(),
        );
        let events = Rows::indexed("event_rows", events_index, self.events.clone());
        let responses = Rows::indexed(
            "responses",
            self.keyed.clone(),
            self.responses.iter().collect(),
        );
        let inputs: Vec<&dyn Param> = [
            (true, &claims as &dyn Param),
            (true, &acts),
            (
                shape.effects.contains(ActionKind::AlertCustomer),
                &alert_window,
            ),
            (shape.attempts, &attempts),
            (shape.calls, &calls_done),
            (shape.calls, &dispatched),
            (true, &outbox),
            (shape.requests, &requests),
            (true, &events),
            (shape.held, &responses),
        ]
        .into_iter()
        .filter_map(|(present, input)| present.then_some(input))
        .collect();
        f(&inputs)
    }

    fn render(&self, shape: Shape, template: &str) -> String {
        self.with(shape, |inputs| render(template, inputs))
    }
}

/// Runs [`TEMPLATE`] (`alone`: as a transaction of its own): the held locks' re-check, the
/// batch's claims, the effects of the acts whose lock held (and the keyless ones), the inline
/// attempts' records, and what the acts whose effects all came out as their own store (each
/// act's [`crate::store::Expected`]).
pub(in crate::store) async fn apply(
    conn: &mut PgConnection,
    batch: &Batch,
    alone: bool,
) -> Result<Found, StoreError> {
    let inputs = Inputs::of(batch);
    let shape = Shape::of(batch, &inputs);
    let rows = inputs
        .with(shape, |params| {
            bind_all(sqlx::query(statement(shape, alone)), params)
        })
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
                    .find(|action| action.as_str() == kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown effect {kind}").into()))?;
                found.effects.insert((kind, i), ours);
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_renders_with_every_input_numbered_once_in_every_shape() {
        assert_eq!(Shape::all().count(), Shape::COUNT);
        assert!(Shape::all().enumerate().all(|(n, s)| s.index() == n));
        for statement in Shape::all().flat_map(|s| [statement(s, false), statement(s, true)]) {
            assert!(!statement.contains('{'), "{statement}");
            // Every parameter from $1 to the last appears, none twice in a row list.
            let last = (1..200)
                .take_while(|n| statement.contains(&format!("${n}::")))
                .last()
                .unwrap_or(0);
            assert!(last > 60, "{last}");
            assert!(!statement.contains(&format!("${}::", last + 1)));
        }
    }

    #[test]
    fn a_shape_holds_the_parts_its_batch_has_rows_for_and_no_other() {
        for shape in Shape::all() {
            let sql = statement(shape, true);
            assert_eq!(sql.contains("calls_recorded"), shape.calls);
            assert_eq!(sql.contains("request_ins"), shape.requests);
            assert_eq!(sql.contains("held_before"), shape.held);
            assert_eq!(
                sql.contains("UPDATE idempotency_keys k SET state = responses"),
                shape.held
            );
            assert_eq!(sql.contains("attempt_moved"), shape.attempts);
            for action in ActionKind::LOCAL {
                assert_eq!(
                    sql.contains(&format!("'{}', o.*", action.as_str())),
                    shape.effects.contains(action),
                    "{action:?} in {shape:?}"
                );
            }
        }
    }
}
