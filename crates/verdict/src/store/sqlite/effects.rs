//! The local effects of a batch's acts, one multi-row statement per table, inside the group
//! commit's transaction ([`super::pipeline`]).
//!
//! An effect is `Done` where this signal's event holds its row afterwards (inserted now, or by
//! an earlier attempt of the same event), else `AlreadyDone`.

use std::collections::{HashMap, HashSet};

use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::subjects::{SubjectActs, apply_subject_holds};
use crate::domain::{ActionKind, Applied};
use crate::store::failpoint::failpoint;
use crate::store::rows::{OutboxRow, RequestRow, Row, push_values};
use crate::store::{Act, ActOutcome, ActionTarget, NewDelivery, StoreError};

/// Applies every act's effects: the subject's row (lock, deny, open case) and alert windows in
/// one query, the other actions one multi-row statement each.
pub(super) async fn apply_effects(
    conn: &mut SqliteConnection,
    acts: &[&Act],
    alert_window_ms: i64,
) -> Result<(Vec<ActOutcome>, Vec<Vec<NewDelivery>>), StoreError> {
    let mut outcomes: Vec<ActOutcome> = acts.iter().map(|_| Default::default()).collect();
    let which = |action: &ActionKind| -> Vec<usize> {
        (0..acts.len())
            .filter(|&i| acts[i].effects.contains(action))
            .collect()
    };
    let targets = |which: &[usize]| -> Vec<&ActionTarget> {
        which.iter().map(|&i| &acts[i].target).collect()
    };
    let subject_acts = SubjectActs {
        lock: targets(&which(&ActionKind::LockAccount)),
        deny: targets(&which(&ActionKind::Deny)),
        open_case: targets(&which(&ActionKind::OpenCase)),
        alert: targets(&which(&ActionKind::AlertCustomer)),
    };
    let mut holds = apply_subject_holds(conn, &subject_acts, alert_window_ms).await?;
    for action in ActionKind::LOCAL {
        let which = which(&action);
        if which.is_empty() {
            continue;
        }
        let applied = match action {
            ActionKind::LockAccount => std::mem::take(&mut holds.lock),
            ActionKind::Deny => std::mem::take(&mut holds.deny),
            ActionKind::OpenCase => std::mem::take(&mut holds.open_case),
            ActionKind::ChargeStepUp => apply_charge_step_up(conn, &targets(&which)).await?,
            ActionKind::AlertCustomer => std::mem::take(&mut holds.alert),
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

/// Records the connector action requests of the actions each act applied itself, at most one
/// per event and action (and per signal and action), and fills in which its event holds and
/// whether this statement inserted it.
pub(super) async fn insert_requests(
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
    let inserted = insert_outbox(conn, &rows.iter().map(|(_, r)| r).collect::<Vec<_>>()).await?;
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
pub(super) fn applied(ours: bool) -> Applied {
    if ours {
        Applied::Done
    } else {
        Applied::AlreadyDone
    }
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
    let inserted = insert_outbox(conn, &unique).await?;
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

/// Inserts outbox rows (callbacks or connector requests), each unless its uniqueness is taken
/// already; returns the ids of those inserted.
async fn insert_outbox<R: Row>(
    conn: &mut SqliteConnection,
    rows: &[&R],
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut q = QueryBuilder::<Sqlite>::new("INSERT INTO deliveries ");
    push_values(&mut q, rows);
    q.push(" ON CONFLICT DO NOTHING RETURNING id");
    Ok(q.build_query_scalar()
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect())
}
