//! A subject's standing holds, its account lock, its standing deny and its open case, all on
//! its one `subjects` row (sqlite/0030), and its alert windows, applied for a whole batch in
//! one query: one hop to sqlx's connection thread instead of one per action, its cases' insert
//! and the lookups of who holds what.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures_util::TryStreamExt;
use sqlx::sqlite::SqliteRow;
use sqlx::{Either, Executor, FromRow, QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::effects::applied;
use crate::domain::Applied;
use crate::store::ActionTarget;

/// The targets of each action a batch applies to its subjects' rows.
#[derive(Default)]
pub(super) struct SubjectActs<'a> {
    pub lock: Vec<&'a ActionTarget>,
    pub deny: Vec<&'a ActionTarget>,
    pub open_case: Vec<&'a ActionTarget>,
    pub alert: Vec<&'a ActionTarget>,
}

/// Per action, per target in the order given: whether its event holds the effect.
#[derive(Debug, Default)]
pub(super) struct SubjectHolds {
    pub lock: Vec<Applied>,
    pub deny: Vec<Applied>,
    pub open_case: Vec<Applied>,
    pub alert: Vec<Applied>,
}

/// What a batch asks of one subject's row: each hold from the first target that asks for it
/// (event, time), and the case it would open (id, event, time).
#[derive(Default)]
struct Asked {
    lock: Option<(Uuid, i64)>,
    deny: Option<(Uuid, i64)>,
    open_case: Option<(Uuid, Uuid, i64)>,
}

/// Who holds a subject's lock, deny and open case after the batch's upsert, and who opened
/// that case.
type Holders = (Option<Uuid>, Option<Uuid>, Option<Uuid>, Option<Uuid>);

/// A row the upsert returns: the subject (tenant, digest), then its [`Holders`].
type HolderRow = (
    Uuid,
    Vec<u8>,
    Option<Uuid>,
    Option<Uuid>,
    Option<Uuid>,
    Option<Uuid>,
);

/// An alert window: tenant, subject digest, signal type.
type WindowKey = (Uuid, Vec<u8>, String);

/// What the batch's one query returns: each subject's [`Holders`], and the event of each alert
/// window it claimed.
#[derive(Default)]
struct Written {
    holders: HashMap<(Uuid, Vec<u8>), Holders>,
    windows: HashMap<WindowKey, Uuid>,
}

/// Locks each subject, issues its standing deny and opens its case where it has none, attaches
/// each later event to the case open, and claims each alert window free within
/// `alert_window_ms`. `Done` where the target's event holds the effect afterwards (now, or from
/// an earlier attempt of the same event); the case's holder is the event that opened it, an
/// alert window's the event that last claimed it.
pub(super) async fn apply_subject_holds(
    conn: &mut SqliteConnection,
    acts: &SubjectActs<'_>,
    alert_window_ms: i64,
) -> Result<SubjectHolds, sqlx::Error> {
    let key = |t: &ActionTarget| (t.tenant_id, t.subject_hash.clone());
    // One row per subject (rows of one statement must not conflict with each other), in key
    // order.
    let mut rows: BTreeMap<(Uuid, Vec<u8>), Asked> = BTreeMap::new();
    for t in &acts.lock {
        let row = rows.entry(key(t)).or_default();
        row.lock.get_or_insert((t.event_id, t.now));
    }
    for t in &acts.deny {
        let row = rows.entry(key(t)).or_default();
        row.deny.get_or_insert((t.event_id, t.now));
    }
    for t in &acts.open_case {
        let row = rows.entry(key(t)).or_default();
        row.open_case
            .get_or_insert((Uuid::now_v7(), t.event_id, t.now));
    }
    let window = |t: &ActionTarget| {
        (
            t.tenant_id,
            t.subject_hash.clone(),
            t.signal_type.to_owned(),
        )
    };
    // One window per key, likewise.
    let mut seen = HashSet::new();
    let mut windows: Vec<_> = acts
        .alert
        .iter()
        .filter(|t| seen.insert(window(t)))
        .collect();
    windows.sort_by_key(|t| window(t));
    if rows.is_empty() && windows.is_empty() {
        return Ok(SubjectHolds::default());
    }
    let mut written = write_rows(conn, &rows, &windows, alert_window_ms).await?;
    // Who holds each window the query did not claim.
    let unclaimed: Vec<WindowKey> = seen
        .into_iter()
        .filter(|w| !written.windows.contains_key(w))
        .collect();
    written
        .windows
        .extend(window_holders(conn, &unclaimed).await?);

    let holder = |t: &ActionTarget| written.holders.get(&key(t)).copied().unwrap_or_default();
    let mut holds = SubjectHolds {
        lock: acts
            .lock
            .iter()
            .map(|t| applied(holder(t).0 == Some(t.event_id)))
            .collect(),
        deny: acts
            .deny
            .iter()
            .map(|t| applied(holder(t).1 == Some(t.event_id)))
            .collect(),
        open_case: Vec::with_capacity(acts.open_case.len()),
        alert: acts
            .alert
            .iter()
            .map(|t| applied(written.windows.get(&window(t)) == Some(&t.event_id)))
            .collect(),
    };
    let mut attach = Vec::new();
    for t in &acts.open_case {
        let (.., case, opener) = holder(t);
        // The case holds its opener; only the events after it are attached.
        if let (Some(case_id), Some(opener)) = (case, opener)
            && opener != t.event_id
        {
            attach.push((case_id, t.event_id, t.now));
        }
        holds.open_case.push(applied(opener == Some(t.event_id)));
    }
    attach_to_cases(conn, &attach).await?;
    Ok(holds)
}

/// Writes the subjects' rows and claims their alert windows, in one query.
async fn write_rows(
    conn: &mut SqliteConnection,
    rows: &BTreeMap<(Uuid, Vec<u8>), Asked>,
    windows: &[&&ActionTarget],
    window_ms: i64,
) -> Result<Written, sqlx::Error> {
    let mut q = QueryBuilder::<Sqlite>::new("");
    // What each statement of the query returns, in order.
    let mut statements = Vec::new();
    if !rows.is_empty() {
        push_upsert_subjects(&mut q, &mut statements, rows);
    }
    if !windows.is_empty() {
        push_claim_windows(&mut q, &mut statements, windows, window_ms);
    }
    let sets = result_sets(conn, &mut q).await?;
    debug_assert_eq!(sets.len(), statements.len(), "a result set per statement");
    let mut written = Written::default();
    for (returns, rows) in statements.into_iter().zip(&sets) {
        for row in rows {
            match returns {
                Returns::Nothing => {}
                Returns::Holders => {
                    let (tenant, subject, lock, deny, case, opener) = HolderRow::from_row(row)?;
                    written
                        .holders
                        .insert((tenant, subject), (lock, deny, case, opener));
                }
                Returns::Windows => {
                    let (tenant, subject, signal_type, event) =
                        <(Uuid, Vec<u8>, String, Uuid)>::from_row(row)?;
                    written
                        .windows
                        .insert((tenant, subject, signal_type), event);
                }
            }
        }
    }
    Ok(written)
}

/// What one statement of [`write_rows`]'s query returns.
#[derive(Clone, Copy)]
enum Returns {
    Nothing,
    Holders,
    Windows,
}

/// Runs a query of several statements; returns each statement's rows, in order (a statement's
/// end comes as its own `QueryResult`, after its rows).
async fn result_sets(
    conn: &mut SqliteConnection,
    q: &mut QueryBuilder<Sqlite>,
) -> Result<Vec<Vec<SqliteRow>>, sqlx::Error> {
    let mut sets = Vec::new();
    let mut current = Vec::new();
    let mut stream = conn.fetch_many(q.build());
    while let Some(item) = stream.try_next().await? {
        match item {
            Either::Right(row) => current.push(row),
            Either::Left(_) => sets.push(std::mem::take(&mut current)),
        }
    }
    Ok(sets)
}

/// Adds to `q` the statements that write each subject's row: first the cases it would open, for
/// subjects with no case open (the next statement's upsert gives them exactly those); then the
/// row, each hold taken where it is free. The upsert returns every row's [`HolderRow`]: it
/// updates a row it finds even when nothing changes, so `RETURNING` covers them all.
fn push_upsert_subjects(
    q: &mut QueryBuilder<Sqlite>,
    statements: &mut Vec<Returns>,
    rows: &BTreeMap<(Uuid, Vec<u8>), Asked>,
) {
    let opening: Vec<_> = rows
        .iter()
        .filter_map(|(subject, asked)| asked.open_case.map(|case| (subject, case)))
        .collect();
    if !opening.is_empty() {
        q.push(
            "INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, opened_at) \
             SELECT column1, column2, column3, 'open', column4, column5 FROM (",
        );
        q.push_values(
            opening,
            |mut row, ((tenant, subject), (case_id, event, at))| {
                row.push_bind(case_id)
                    .push_bind(*tenant)
                    .push_bind(subject.clone())
                    .push_bind(event)
                    .push_bind(at);
            },
        );
        q.push(
            ") AS v WHERE NOT EXISTS (SELECT 1 FROM subjects s \
             WHERE s.tenant_id = v.column2 AND s.subject_hash = v.column3 \
             AND s.open_case IS NOT NULL); ",
        );
        statements.push(Returns::Nothing);
    }
    q.push(
        "INSERT INTO subjects (tenant_id, subject_hash, locked_by, locked_at, denied_by, \
         denied_at, open_case) ",
    );
    q.push_values(rows, |mut row, ((tenant, subject), asked)| {
        row.push_bind(*tenant)
            .push_bind(subject.clone())
            .push_bind(asked.lock.map(|(event, _)| event))
            .push_bind(asked.lock.map(|(_, at)| at))
            .push_bind(asked.deny.map(|(event, _)| event))
            .push_bind(asked.deny.map(|(_, at)| at))
            .push_bind(asked.open_case.map(|(case_id, ..)| case_id));
    });
    // Each expression reads the row as it was: a hold already there stays, with its time.
    q.push(
        " ON CONFLICT (tenant_id, subject_hash) DO UPDATE SET \
         locked_by = coalesce(subjects.locked_by, excluded.locked_by), \
         locked_at = CASE WHEN subjects.locked_by IS NULL THEN excluded.locked_at \
         ELSE subjects.locked_at END, \
         denied_by = coalesce(subjects.denied_by, excluded.denied_by), \
         denied_at = CASE WHEN subjects.denied_by IS NULL THEN excluded.denied_at \
         ELSE subjects.denied_at END, \
         open_case = coalesce(subjects.open_case, excluded.open_case) \
         RETURNING tenant_id, subject_hash, locked_by, denied_by, open_case, \
         (SELECT c.opened_by_event FROM cases c WHERE c.id = subjects.open_case); ",
    );
    statements.push(Returns::Holders);
}

/// Adds to `q` the statement that claims each alert window free within `window_ms` (inserting
/// it, or moving an expired one to this event); it returns the windows it claimed.
fn push_claim_windows(
    q: &mut QueryBuilder<Sqlite>,
    statements: &mut Vec<Returns>,
    windows: &[&&ActionTarget],
    window_ms: i64,
) {
    q.push(
        "INSERT INTO alert_windows (tenant_id, subject_hash, signal_type, event_id, \
         last_sent_at) ",
    );
    q.push_values(windows, |mut row, t| {
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
    q.push(" RETURNING tenant_id, subject_hash, signal_type, event_id; ");
    statements.push(Returns::Windows);
}

/// Which event holds each of `windows` (none if there are none).
async fn window_holders(
    conn: &mut SqliteConnection,
    windows: &[WindowKey],
) -> Result<Vec<(WindowKey, Uuid)>, sqlx::Error> {
    if windows.is_empty() {
        return Ok(Vec::new());
    }
    let mut q = QueryBuilder::<Sqlite>::new(
        "SELECT tenant_id, subject_hash, signal_type, event_id FROM alert_windows \
         WHERE (tenant_id, subject_hash, signal_type) IN (VALUES ",
    );
    let mut list = q.separated(", ");
    for (tenant, subject, signal_type) in windows {
        list.push("(");
        list.push_bind_unseparated(*tenant);
        list.push_unseparated(", ");
        list.push_bind_unseparated(subject.clone());
        list.push_unseparated(", ");
        list.push_bind_unseparated(signal_type.clone());
        list.push_unseparated(")");
    }
    q.push(")");
    let held: Vec<(Uuid, Vec<u8>, String, Uuid)> = q.build_query_as().fetch_all(&mut *conn).await?;
    Ok(held
        .into_iter()
        .map(|(tenant, subject, signal_type, event)| ((tenant, subject, signal_type), event))
        .collect())
}

/// Attaches events to their subject's open case (none if there are none).
async fn attach_to_cases(
    conn: &mut SqliteConnection,
    attach: &[(Uuid, Uuid, i64)],
) -> Result<(), sqlx::Error> {
    if attach.is_empty() {
        return Ok(());
    }
    let mut q =
        QueryBuilder::<Sqlite>::new("INSERT INTO case_events (case_id, event_id, attached_at) ");
    q.push_values(attach, |mut row, (case_id, event_id, at)| {
        row.push_bind(*case_id).push_bind(*event_id).push_bind(*at);
    });
    q.push(" ON CONFLICT DO NOTHING");
    q.build().execute(&mut *conn).await?;
    Ok(())
}
