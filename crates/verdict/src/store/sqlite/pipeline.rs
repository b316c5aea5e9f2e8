//! SQLite's group commit: each step one multi-row statement in one `BEGIN IMMEDIATE`
//! transaction. SQLite runs statements in-process, so the steps are calls, not round trips;
//! PostgreSQL fuses the same steps into one statement ([`super::super::postgres_pipeline`]).
//!
//! An effect is `Done` where this signal's event holds its row afterwards (inserted now, or by
//! an earlier attempt of the same event), else `AlreadyDone`.

use std::collections::{HashMap, HashSet};

use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::SqliteStore;
use crate::domain::{ActionKind, Applied};
use crate::store::actions::push_keys;
use crate::store::backend::execute_pushed;
use crate::store::deliveries::record_attempts;
use crate::store::failpoint::failpoint;
use crate::store::keys::{complete_calls_in, insert_claims};
use crate::store::pipeline::{batch_result, live_acts};
use crate::store::rows::{OutboxRow, RequestRow, push_values};
use crate::store::{
    Act, ActOutcome, ActionTarget, Batch, BatchResult, Finished, HeldKey, NewDelivery, NewEvent,
    PipelineStore, StoreError,
};

/// Applies every act's effects, one multi-row statement per action.
async fn apply_effects(
    conn: &mut SqliteConnection,
    acts: &[&Act],
    alert_window_ms: i64,
) -> Result<(Vec<ActOutcome>, Vec<Vec<NewDelivery>>), StoreError> {
    let mut outcomes: Vec<ActOutcome> = acts.iter().map(|_| Default::default()).collect();
    for action in ActionKind::LOCAL {
        let which: Vec<usize> = (0..acts.len())
            .filter(|&i| acts[i].effects.contains(&action))
            .collect();
        if which.is_empty() {
            continue;
        }
        let targets: Vec<_> = which.iter().map(|&i| &acts[i].target).collect();
        let applied = match action {
            // One lock per subject, on its row.
            ActionKind::LockAccount => {
                let lock = OncePerSubject {
                    insert: "INSERT INTO subjects (tenant_id, subject_hash, locked_by, \
                             locked_at) ",
                    upsert: " ON CONFLICT (tenant_id, subject_hash) DO UPDATE \
                             SET locked_by = excluded.locked_by, locked_at = excluded.locked_at \
                             WHERE subjects.locked_by IS NULL \
                             RETURNING tenant_id, subject_hash, locked_by",
                    holders: "SELECT tenant_id, subject_hash, locked_by FROM subjects \
                              WHERE locked_by IS NOT NULL AND (tenant_id, subject_hash) IN ",
                };
                apply_once_per_subject(conn, &lock, &targets).await?
            }
            // One standing deny per subject, on the same row.
            ActionKind::Deny => {
                let deny = OncePerSubject {
                    insert: "INSERT INTO subjects (tenant_id, subject_hash, denied_by, \
                             denied_at) ",
                    upsert: " ON CONFLICT (tenant_id, subject_hash) DO UPDATE \
                             SET denied_by = excluded.denied_by, denied_at = excluded.denied_at \
                             WHERE subjects.denied_by IS NULL \
                             RETURNING tenant_id, subject_hash, denied_by",
                    holders: "SELECT tenant_id, subject_hash, denied_by FROM subjects \
                              WHERE denied_by IS NOT NULL AND (tenant_id, subject_hash) IN ",
                };
                apply_once_per_subject(conn, &deny, &targets).await?
            }
            ActionKind::ChargeStepUp => apply_charge_step_up(conn, &targets).await?,
            ActionKind::OpenCase => apply_open_case(conn, &targets).await?,
            ActionKind::AlertCustomer => {
                apply_alert_customer(conn, &targets, alert_window_ms).await?
            }
            ActionKind::Callback
            | ActionKind::UnlockAccount
            | ActionKind::LiftDeny
            | ActionKind::CloseCase
            | ActionKind::Custom(_) => continue,
        };
        for (&i, applied) in which.iter().zip(applied) {
            outcomes[i].effects.push((action, applied));
        }
        failpoint!(&crate::store::failpoint::after_action(action));
    }
    // Each callback's envelope, built now that the local effects are known: one row per
    // endpoint that takes it.
    let deliveries: Vec<Vec<NewDelivery>> = acts
        .iter()
        .zip(&outcomes)
        .map(|(a, o)| a.deliveries_for(&o.effects))
        .collect();
    let (owners, rows): (Vec<usize>, Vec<_>) = deliveries
        .iter()
        .enumerate()
        .flat_map(|(i, ds)| {
            ds.iter().map(move |delivery| {
                let target = &acts[i].target;
                (i, OutboxRow { target, delivery })
            })
        })
        .unzip();
    for ((&i, row), (applied, fresh)) in owners
        .iter()
        .zip(&rows)
        .zip(insert_deliveries(conn, &rows).await?)
    {
        // Done where this event holds any of them: the signal's callback is its.
        let outcome = &mut outcomes[i];
        if outcome.callback != Some(Applied::Done) {
            outcome.callback = Some(applied);
        }
        if fresh {
            outcome.callbacks_inserted.push(row.delivery.id);
        }
    }
    Ok((outcomes, deliveries))
}

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

/// Records the connector action requests of the actions each act applied itself, at most one
/// per event and action (and per signal and action), and fills in which its event holds and
/// whether this statement inserted it.
async fn insert_requests(
    conn: &mut SqliteConnection,
    acts: &[&Act],
    outcomes: &mut [ActOutcome],
) -> Result<(), sqlx::Error> {
    let rows: Vec<(usize, RequestRow<'_>)> = acts
        .iter()
        .zip(outcomes.iter())
        .enumerate()
        .flat_map(|(n, (act, outcome))| {
            act.requests_for(&outcome.effects)
                .into_iter()
                .map(move |request| {
                    let target = &act.target;
                    (n, RequestRow { target, request })
                })
        })
        .collect();
    if rows.is_empty() {
        return Ok(());
    }
    let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO deliveries ");
    push_values(&mut q, &rows.iter().map(|(_, r)| r).collect::<Vec<_>>());
    q.push(" ON CONFLICT DO NOTHING RETURNING id");
    let inserted: HashSet<Uuid> = q
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    // Those not inserted now: held by this event since an earlier attempt, or by another.
    let mut held = QueryBuilder::<Sqlite>::new(
        "SELECT event_id, action FROM deliveries WHERE (event_id, action) IN (VALUES ",
    );
    let mut list = held.separated(", ");
    let mut any = false;
    for (_, r) in rows
        .iter()
        .filter(|(_, r)| !inserted.contains(&r.request.id))
    {
        any = true;
        list.push("(");
        list.push_bind_unseparated(r.target.event_id);
        list.push_unseparated(", ");
        list.push_bind_unseparated(r.request.action.as_str());
        list.push_unseparated(")");
    }
    held.push(")");
    let earlier: HashSet<(Uuid, String)> = if any {
        held.build_query_as()
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect()
    } else {
        HashSet::new()
    };
    for (n, r) in &rows {
        let fresh = inserted.contains(&r.request.id);
        let ours =
            fresh || earlier.contains(&(r.target.event_id, r.request.action.as_str().to_owned()));
        if ours {
            outcomes[*n].requests.push((r.request.action, fresh));
        }
    }
    Ok(())
}

/// Looks up who holds `keys` with `select` (a statement ending in `IN `), as a map.
async fn holders_of(
    conn: &mut SqliteConnection,
    select: &'static str,
    keys: &[(Uuid, Vec<u8>)],
) -> Result<HashMap<(Uuid, Vec<u8>), Uuid>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(Default::default());
    }
    let mut q = QueryBuilder::<Sqlite>::new(select);
    push_keys(&mut q, keys);
    let rows: Vec<(Uuid, Vec<u8>, Uuid)> = q.build_query_as().fetch_all(conn).await?;
    Ok(rows.into_iter().map(|(t, k, e)| ((t, k), e)).collect())
}

/// An effect held at most once per subject, by the event that applied it: a pair of columns
/// (event, time) of the subject's row.
struct OncePerSubject {
    /// The statement that inserts rows, up to its `VALUES`.
    insert: &'static str,
    /// What follows the `VALUES`: a row already there takes the hold if it has none, and the
    /// rows whose hold this statement wrote are returned (tenant, subject, event).
    upsert: &'static str,
    /// Who holds subjects the insert did not take, up to the list of keys.
    holders: &'static str,
}

/// Applies an effect held once per subject for each target: `Done` where the target's
/// event holds the subject's row afterwards (now, or from an earlier attempt of the same event).
async fn apply_once_per_subject(
    conn: &mut SqliteConnection,
    kind: &OncePerSubject,
    targets: &[&ActionTarget],
) -> Result<Vec<Applied>, sqlx::Error> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let key = |t: &ActionTarget| (t.tenant_id, t.subject_hash.clone());
    // One row per key: rows of one statement must not conflict with each other.
    let mut seen = HashSet::new();
    let mut rows: Vec<_> = targets.iter().filter(|t| seen.insert(key(t))).collect();
    // Concurrent batches take the keys' index locks in one order: no deadlock cycle.
    rows.sort_by_key(|t| key(t));
    let mut q = QueryBuilder::<Sqlite>::new(kind.insert);
    q.push_values(rows, |mut row, t| {
        row.push_bind(t.tenant_id)
            .push_bind(t.subject_hash.clone())
            .push_bind(t.event_id)
            .push_bind(t.now);
    });
    q.push(kind.upsert);
    let inserted: Vec<(Uuid, Vec<u8>, Uuid)> = q.build_query_as().fetch_all(&mut *conn).await?;
    let mut holder: HashMap<_, _> = inserted.into_iter().map(|(t, k, e)| ((t, k), e)).collect();
    let missing: Vec<_> = targets
        .iter()
        .map(|t| key(t))
        .filter(|k| !holder.contains_key(k))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    holder.extend(holders_of(conn, kind.holders, &missing).await?);
    Ok(targets
        .iter()
        .map(|t| applied(holder.get(&key(t)) == Some(&t.event_id)))
        .collect())
}

/// Charges one step-up per signal: `Done` where the target's event holds its signal's
/// ledger entry afterwards. Entries are unique by (tenant, observation time, signal key), in
/// time order (sqlite/0029). One stored before that whose event was pruned has no time: it is
/// in `ledger_entries_untimed`, checked first, and its event (pruned) is no target's, so the
/// target's charge is `AlreadyDone`.
async fn apply_charge_step_up(
    conn: &mut SqliteConnection,
    targets: &[&ActionTarget],
) -> Result<Vec<Applied>, sqlx::Error> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    // The signal key fixes the time: (tenant, time, key) is as unique as (tenant, key).
    let key = |t: &ActionTarget| (t.tenant_id, t.observed_at, t.signal_key.clone());
    let mut seen = HashSet::new();
    let mut rows: Vec<_> = targets.iter().filter(|t| seen.insert(key(t))).collect();
    // In the index's order: signals observed about now, side by side.
    rows.sort_by_key(|t| key(t));
    let mut q = QueryBuilder::<Sqlite>::new(
        "INSERT INTO ledger_entries (tenant_id, observed_at, signal_key, event_id, created_at, \
         id, subject_hash, kind) \
         SELECT column1, column2, column3, column4, column5, column6, column7, \
         'step_up_verification' FROM (",
    );
    q.push_values(&rows, |mut row, t| {
        row.push_bind(t.tenant_id)
            .push_bind(t.observed_at)
            .push_bind(t.signal_key.clone())
            .push_bind(t.event_id)
            .push_bind(t.now)
            .push_bind(Uuid::now_v7())
            .push_bind(t.subject_hash.clone());
    });
    q.push(
        ") AS v WHERE NOT EXISTS (SELECT 1 FROM ledger_entries_untimed x \
         WHERE x.tenant_id = v.column1 AND x.signal_key = v.column3) \
         ON CONFLICT DO NOTHING RETURNING tenant_id, observed_at, signal_key, event_id",
    );
    let inserted: Vec<(Uuid, i64, Vec<u8>, Uuid)> =
        q.build_query_as().fetch_all(&mut *conn).await?;
    let mut holder: HashMap<_, _> = inserted
        .into_iter()
        .map(|(t, at, k, e)| ((t, at, k), e))
        .collect();
    let missing: Vec<_> = rows
        .into_iter()
        .filter(|t| !holder.contains_key(&key(t)))
        .collect();
    if !missing.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT tenant_id, observed_at, signal_key, event_id FROM ledger_entries \
             WHERE (tenant_id, observed_at, signal_key) IN (",
        );
        q.push_values(missing, |mut row, t| {
            row.push_bind(t.tenant_id)
                .push_bind(t.observed_at)
                .push_bind(t.signal_key.clone());
        });
        q.push(")");
        let found: Vec<(Uuid, i64, Vec<u8>, Uuid)> =
            q.build_query_as().fetch_all(&mut *conn).await?;
        holder.extend(found.into_iter().map(|(t, at, k, e)| ((t, at, k), e)));
    }
    Ok(targets
        .iter()
        .map(|t| applied(holder.get(&key(t)) == Some(&t.event_id)))
        .collect())
}

/// `Done` when the target's own event holds the effect.
fn applied(ours: bool) -> Applied {
    if ours {
        Applied::Done
    } else {
        Applied::AlreadyDone
    }
}

/// Opens a case per subject, or attaches each event to its subject's open case.
async fn apply_open_case(
    conn: &mut SqliteConnection,
    targets: &[&ActionTarget],
) -> Result<Vec<Applied>, sqlx::Error> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let key = |t: &ActionTarget| (t.tenant_id, t.subject_hash.clone());
    let mut seen = HashSet::new();
    let mut rows: Vec<_> = targets
        .iter()
        .filter(|t| seen.insert(key(t)))
        .map(|t| (Uuid::now_v7(), t))
        .collect();
    rows.sort_by_key(|(_, t)| key(t));
    // The subject's row takes a new case's id when it has none: one open case per subject.
    let mut q =
        QueryBuilder::<Sqlite>::new("INSERT INTO subjects (tenant_id, subject_hash, open_case) ");
    q.push_values(&rows, |mut row, (case_id, t)| {
        row.push_bind(t.tenant_id)
            .push_bind(t.subject_hash.clone())
            .push_bind(*case_id);
    });
    q.push(
        " ON CONFLICT (tenant_id, subject_hash) DO UPDATE SET open_case = excluded.open_case \
         WHERE subjects.open_case IS NULL RETURNING open_case",
    );
    let taken: HashSet<Uuid> = q
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    let opened: Vec<_> = rows
        .iter()
        .filter(|(case_id, _)| taken.contains(case_id))
        .collect();
    let mut open: HashMap<_, _> = HashMap::with_capacity(rows.len());
    if !opened.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, \
             opened_at) ",
        );
        q.push_values(&opened, |mut row, (case_id, t)| {
            row.push_bind(*case_id)
                .push_bind(t.tenant_id)
                .push_bind(t.subject_hash.clone())
                .push_bind("open")
                .push_bind(t.event_id)
                .push_bind(t.now);
        });
        q.build().execute(&mut *conn).await?;
        open.extend(
            opened
                .iter()
                .map(|(case_id, t)| (key(t), (*case_id, t.event_id))),
        );
    }
    // The open case of every other subject: an earlier one.
    let missing: Vec<_> = seen.into_iter().filter(|k| !open.contains_key(k)).collect();
    if !missing.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT s.tenant_id, s.subject_hash, c.id, c.opened_by_event FROM subjects s \
             JOIN cases c ON c.id = s.open_case WHERE (s.tenant_id, s.subject_hash) IN ",
        );
        push_keys(&mut q, &missing);
        let earlier: Vec<(Uuid, Vec<u8>, Uuid, Uuid)> =
            q.build_query_as().fetch_all(&mut *conn).await?;
        open.extend(
            earlier
                .into_iter()
                .map(|(t, s, id, opener)| ((t, s), (id, opener))),
        );
    }
    let mut attach = Vec::with_capacity(targets.len());
    let mut outcomes = Vec::with_capacity(targets.len());
    for t in targets {
        let Some(&(case_id, opener)) = open.get(&key(t)) else {
            outcomes.push(Applied::AlreadyDone);
            continue;
        };
        // The case holds its opener; only the events after it are attached.
        if opener != t.event_id {
            attach.push((case_id, t.event_id, t.now));
        }
        outcomes.push(applied(opener == t.event_id));
    }
    if !attach.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "INSERT INTO case_events (case_id, event_id, attached_at) ",
        );
        q.push_values(attach, |mut row, (case_id, event_id, at)| {
            row.push_bind(case_id).push_bind(event_id).push_bind(at);
        });
        q.push(" ON CONFLICT DO NOTHING");
        q.build().execute(&mut *conn).await?;
    }
    Ok(outcomes)
}

/// Alerts each subject unless it was alerted about this signal type within
/// `window_ms`: claims the window (inserting it, or moving an expired one to this
/// event). An event that holds its window alerted; its record is the window row and the
/// event's own action outcome.
async fn apply_alert_customer(
    conn: &mut SqliteConnection,
    targets: &[&ActionTarget],
    window_ms: i64,
) -> Result<Vec<Applied>, sqlx::Error> {
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let key = |t: &ActionTarget| (t.tenant_id, t.subject_hash.clone(), t.signal_type);
    let mut seen = HashSet::new();
    let mut rows: Vec<_> = targets.iter().filter(|t| seen.insert(key(t))).collect();
    rows.sort_by_key(|t| key(t));
    let mut q = QueryBuilder::<Sqlite>::new(
        "INSERT INTO alert_windows (tenant_id, subject_hash, signal_type, event_id, \
         last_sent_at) ",
    );
    q.push_values(rows, |mut row, t| {
        row.push_bind(t.tenant_id)
            .push_bind(t.subject_hash.clone())
            .push_bind(t.signal_type)
            .push_bind(t.event_id)
            .push_bind(t.now);
    });
    q.push(
        " ON CONFLICT (tenant_id, subject_hash, signal_type) DO UPDATE \
         SET event_id = excluded.event_id, last_sent_at = excluded.last_sent_at \
         WHERE alert_windows.last_sent_at <= excluded.last_sent_at - ",
    );
    q.push_bind(window_ms);
    q.push(" RETURNING tenant_id, subject_hash, signal_type, event_id");
    let claimed: Vec<(Uuid, Vec<u8>, String, Uuid)> =
        q.build_query_as().fetch_all(&mut *conn).await?;
    let mut holder: HashMap<_, _> = claimed
        .into_iter()
        .map(|(t, s, ty, e)| ((t, s, ty), e))
        .collect();
    // Who holds each window this statement did not claim.
    let missing: Vec<_> = seen
        .iter()
        .filter(|(t, s, ty)| !holder.contains_key(&(*t, s.clone(), (*ty).to_owned())))
        .collect();
    if !missing.is_empty() {
        let mut q = QueryBuilder::<Sqlite>::new(
            "SELECT tenant_id, subject_hash, signal_type, event_id FROM alert_windows \
             WHERE (tenant_id, subject_hash, signal_type) IN (VALUES ",
        );
        let mut list = q.separated(", ");
        for (tenant, subject, signal_type) in missing {
            list.push("(");
            list.push_bind_unseparated(*tenant);
            list.push_unseparated(", ");
            list.push_bind_unseparated(subject.clone());
            list.push_unseparated(", ");
            list.push_bind_unseparated(*signal_type);
            list.push_unseparated(")");
        }
        q.push(")");
        let held: Vec<(Uuid, Vec<u8>, String, Uuid)> =
            q.build_query_as().fetch_all(&mut *conn).await?;
        holder.extend(held.into_iter().map(|(t, s, ty, e)| ((t, s, ty), e)));
    }
    let ours: Vec<bool> = targets
        .iter()
        .map(|t| {
            holder.get(&(
                t.tenant_id,
                t.subject_hash.clone(),
                t.signal_type.to_owned(),
            )) == Some(&t.event_id)
        })
        .collect();
    Ok(ours.into_iter().map(applied).collect())
}

/// Records callbacks in the outbox, one per signal and endpoint: returns, per row, whether
/// this event holds the signal's callback and whether this statement inserted the row (only
/// then does its inline attempt go out, with exactly the bytes stored).
async fn insert_deliveries(
    conn: &mut SqliteConnection,
    rows: &[OutboxRow<'_>],
) -> Result<Vec<(Applied, bool)>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let key = |r: &OutboxRow<'_>| (r.target.tenant_id, r.target.signal_key.clone());
    let row_key = |r: &OutboxRow<'_>| {
        (
            r.target.tenant_id,
            r.target.signal_key.clone(),
            r.delivery.endpoint_id,
        )
    };
    let mut seen = HashSet::new();
    let mut unique: Vec<_> = rows.iter().filter(|r| seen.insert(row_key(r))).collect();
    unique.sort_by_key(|r| row_key(r));
    let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO deliveries ");
    push_values(&mut q, &unique);
    q.push(" ON CONFLICT DO NOTHING RETURNING id");
    let inserted: HashSet<Uuid> = q
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    let mut asked = HashSet::new();
    let missing: Vec<&OutboxRow<'_>> = rows
        .iter()
        .filter(|r| !inserted.contains(&r.delivery.id) && asked.insert(key(r)))
        .collect();
    let holder = callback_holders(conn, &missing).await?;
    Ok(rows
        .iter()
        .map(|r| {
            let fresh = inserted.contains(&r.delivery.id);
            let ours = fresh || holder.get(&key(r)) == Some(&r.target.event_id);
            (applied(ours), fresh)
        })
        .collect())
}

/// Which event holds the callback of each of `rows`' signals, looked up by the unique
/// index's leading columns (tenant, observation time, signal key).
async fn callback_holders(
    conn: &mut SqliteConnection,
    rows: &[&OutboxRow<'_>],
) -> Result<HashMap<(Uuid, Vec<u8>), Uuid>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let mut q = QueryBuilder::<Sqlite>::new(
        "SELECT tenant_id, signal_key, event_id FROM deliveries \
         WHERE action = 'callback' AND (tenant_id, observed_at, signal_key) IN (VALUES ",
    );
    let mut list = q.separated(", ");
    for r in rows {
        list.push("(");
        list.push_bind_unseparated(r.target.tenant_id);
        list.push_unseparated(", ");
        list.push_bind_unseparated(r.target.observed_at);
        list.push_unseparated(", ");
        list.push_bind_unseparated(r.target.signal_key.clone());
        list.push_unseparated(")");
    }
    q.push(")");
    let found: Vec<(Uuid, Vec<u8>, Uuid)> = q.build_query_as().fetch_all(conn).await?;
    Ok(found.into_iter().map(|(t, k, e)| ((t, k), e)).collect())
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
