//! A subject's standing holds, its account lock, its standing deny and its open case, all on
//! its one `subjects` row (sqlite/0030), applied for a whole batch in one query: one hop to
//! sqlx's connection thread instead of one per action, its cases' insert and the lookups of
//! who holds what.

use std::collections::{BTreeMap, HashMap};

use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

use super::effects::applied;
use crate::domain::Applied;
use crate::store::ActionTarget;

/// Per action, per target in the order given: whether its event holds the effect.
#[derive(Debug, Default)]
pub(super) struct SubjectHolds {
    pub lock: Vec<Applied>,
    pub deny: Vec<Applied>,
    pub open_case: Vec<Applied>,
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

/// Locks each subject, issues its standing deny and opens its case where it has none, and
/// attaches each later event to the case open. `Done` where the target's event holds the hold
/// afterwards (now, or from an earlier attempt of the same event); the case's holder is the
/// event that opened it.
pub(super) async fn apply_subject_holds(
    conn: &mut SqliteConnection,
    lock: &[&ActionTarget],
    deny: &[&ActionTarget],
    open_case: &[&ActionTarget],
) -> Result<SubjectHolds, sqlx::Error> {
    let key = |t: &ActionTarget| (t.tenant_id, t.subject_hash.clone());
    // One row per subject (rows of one statement must not conflict with each other), in key
    // order.
    let mut rows: BTreeMap<(Uuid, Vec<u8>), Asked> = BTreeMap::new();
    for t in lock {
        let row = rows.entry(key(t)).or_default();
        row.lock.get_or_insert((t.event_id, t.now));
    }
    for t in deny {
        let row = rows.entry(key(t)).or_default();
        row.deny.get_or_insert((t.event_id, t.now));
    }
    for t in open_case {
        let row = rows.entry(key(t)).or_default();
        row.open_case
            .get_or_insert((Uuid::now_v7(), t.event_id, t.now));
    }
    if rows.is_empty() {
        return Ok(SubjectHolds::default());
    }
    let held = upsert_subjects(conn, &rows).await?;

    let holder = |t: &ActionTarget| held.get(&key(t)).copied().unwrap_or_default();
    let mut holds = SubjectHolds {
        lock: lock
            .iter()
            .map(|t| applied(holder(t).0 == Some(t.event_id)))
            .collect(),
        deny: deny
            .iter()
            .map(|t| applied(holder(t).1 == Some(t.event_id)))
            .collect(),
        open_case: Vec::with_capacity(open_case.len()),
    };
    let mut attach = Vec::new();
    for t in open_case {
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

/// Writes each subject's row, in one query: first the cases it would open, for subjects with no
/// case open (the next statement's upsert gives them exactly those); then the row, each hold
/// taken where it is free. Returns every row's holders: the upsert updates a row it finds even
/// when nothing changes, so `RETURNING` covers them all.
async fn upsert_subjects(
    conn: &mut SqliteConnection,
    rows: &BTreeMap<(Uuid, Vec<u8>), Asked>,
) -> Result<HashMap<(Uuid, Vec<u8>), Holders>, sqlx::Error> {
    let mut q = QueryBuilder::<Sqlite>::new("");
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
         (SELECT c.opened_by_event FROM cases c WHERE c.id = subjects.open_case)",
    );
    let held: Vec<HolderRow> = q.build_query_as().fetch_all(&mut *conn).await?;
    Ok(held
        .into_iter()
        .map(|(tenant, subject, lock, deny, case, opener)| {
            ((tenant, subject), (lock, deny, case, opener))
        })
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
