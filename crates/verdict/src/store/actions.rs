//! The idempotent actions' tables (locks, cases, alerts, step-up ledger, denies): each has a
//! natural key that makes a repeated action a no-op, and records the event that applied it, so a
//! retry of the same event reads "done" and a duplicate signal reads "already done".
//!
//! The statements apply one action for a whole batch of signals at once (the group commit's
//! multi-row statements); a conflict in one row never fails the others.

use async_trait::async_trait;
use uuid::Uuid;

use super::StoreError;

/// How a backend passes a list of (tenant, bytes) keys into a statement: as a table whose
/// columns are `column1` and `column2`, usable after `FROM` or `IN`.
pub(crate) trait KeyList: sqlx::Database {
    /// Pushes the table for `keys`.
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]);
}

impl KeyList for sqlx::Postgres {
    /// Two arrays, so the statement has one shape whatever the number of keys: PostgreSQL
    /// parses and plans it once per connection instead of once per list length.
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]) {
        q.push("(SELECT * FROM unnest(");
        q.push_bind(keys.iter().map(|(tenant, _)| *tenant).collect::<Vec<_>>());
        q.push("::uuid[], ");
        q.push_bind(keys.iter().map(|(_, key)| key.clone()).collect::<Vec<_>>());
        q.push("::bytea[]) AS k(column1, column2))");
    }
}

impl KeyList for sqlx::Sqlite {
    /// `(VALUES (a, b), (c, d))`: SQLite has no arrays, and prepares in process.
    fn push_keys(q: &mut sqlx::QueryBuilder<Self>, keys: &[(Uuid, Vec<u8>)]) {
        q.push("(VALUES ");
        let mut list = q.separated(", ");
        for (tenant, key) in keys {
            list.push("(");
            list.push_bind_unseparated(*tenant);
            list.push_unseparated(", ");
            list.push_bind_unseparated(key.clone());
            list.push_unseparated(")");
        }
        q.push(")");
    }
}

/// Who an action is about and which event applies it.
#[derive(Clone, Debug)]
pub struct ActionTarget {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    pub subject_hash: Vec<u8>,
    /// Digest of (subject, type, observed_at): the same signal under any key or none.
    pub signal_key: Vec<u8>,
    pub signal_type: &'static str,
    pub now: i64,
}

/// What currently stands against a subject.
#[derive(Clone, Debug, Default)]
pub struct SubjectState {
    /// The event that locked the account, and when.
    pub lock: Option<(Uuid, i64)>,
    /// Open cases: id, opening time, attached events.
    pub open_cases: Vec<(Uuid, i64, Vec<Uuid>)>,
    /// The event that issued the standing deny, and when.
    pub deny: Option<(Uuid, i64)>,
}

/// An effect held at most once per natural key, by the event that applied it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OncePerKey {
    /// One lock per subject.
    Lock,
    /// One standing deny per subject.
    Deny,
    /// One step-up charge per signal.
    Ledger,
}

impl OncePerKey {
    /// The statement that inserts rows, up to its `VALUES`.
    pub(crate) fn insert(self) -> &'static str {
        match self {
            Self::Lock => {
                "INSERT INTO account_locks (tenant_id, subject_hash, event_id, locked_at) "
            }
            Self::Deny => "INSERT INTO denies (tenant_id, subject_hash, event_id, issued_at) ",
            Self::Ledger => {
                "INSERT INTO ledger_entries (tenant_id, signal_key, event_id, created_at, id, \
                 subject_hash, kind) "
            }
        }
    }

    /// What the insert returns: the key and the event that now holds it.
    pub(crate) fn returning(self) -> &'static str {
        match self {
            Self::Lock | Self::Deny => {
                " ON CONFLICT DO NOTHING RETURNING tenant_id, subject_hash, event_id"
            }
            Self::Ledger => " ON CONFLICT DO NOTHING RETURNING tenant_id, signal_key, event_id",
        }
    }

    /// Who holds keys the insert did not take, up to the list of keys.
    pub(crate) fn holders(self) -> &'static str {
        match self {
            Self::Lock => {
                "SELECT tenant_id, subject_hash, event_id FROM account_locks \
                 WHERE (tenant_id, subject_hash) IN "
            }
            Self::Deny => {
                "SELECT tenant_id, subject_hash, event_id FROM denies \
                 WHERE (tenant_id, subject_hash) IN "
            }
            Self::Ledger => {
                "SELECT tenant_id, signal_key, event_id FROM ledger_entries \
                 WHERE (tenant_id, signal_key) IN "
            }
        }
    }

    /// The natural key of a target's row.
    pub(crate) fn key(self, t: &ActionTarget) -> (Uuid, Vec<u8>) {
        match self {
            Self::Lock | Self::Deny => (t.tenant_id, t.subject_hash.clone()),
            Self::Ledger => (t.tenant_id, t.signal_key.clone()),
        }
    }
}

/// Reads of the actions' state.
#[async_trait]
pub trait ActionStore {
    /// Locks, open cases and the standing deny of a subject; `None` if the tenant has no event
    /// about it.
    async fn subject(
        &self,
        tenant_id: Uuid,
        subject_hash: &[u8],
    ) -> Result<Option<SubjectState>, StoreError>;
}

/// The batched action statements and [`ActionStore`] for a backend.
macro_rules! actions_sql {
    ($store:ty, $conn:ty) => {
        /// Pushes a list of (tenant, bytes) keys as a table with columns `column1` and
        /// `column2` (see [`$crate::store::actions::KeyList`]).
        fn push_keys(q: &mut sqlx::QueryBuilder<Db>, keys: &[(uuid::Uuid, Vec<u8>)]) {
            <Db as $crate::store::actions::KeyList>::push_keys(q, keys)
        }

        /// Looks up who holds `keys` with `select` (a statement ending in `IN `), as a map.
        // Only SQLite runs this; PostgreSQL fuses it into store/postgres_pipeline/.
        #[allow(dead_code)]
        async fn holders_of(
            conn: &mut $conn,
            select: &'static str,
            keys: &[(uuid::Uuid, Vec<u8>)],
        ) -> Result<std::collections::HashMap<(uuid::Uuid, Vec<u8>), uuid::Uuid>, sqlx::Error> {
            if keys.is_empty() {
                return Ok(Default::default());
            }
            let mut q = sqlx::QueryBuilder::<Db>::new(select);
            push_keys(&mut q, keys);
            let rows: Vec<(uuid::Uuid, Vec<u8>, uuid::Uuid)> =
                q.build_query_as().fetch_all(conn).await?;
            Ok(rows.into_iter().map(|(t, k, e)| ((t, k), e)).collect())
        }

        /// Applies an effect held once per key for each target: `Done` where the target's
        /// event holds the key afterwards (now, or from an earlier attempt of the same event).
        // Only SQLite runs this; PostgreSQL fuses it into store/postgres_pipeline/.
        #[allow(dead_code)]
        async fn apply_once_per_key(
            conn: &mut $conn,
            kind: $crate::store::actions::OncePerKey,
            targets: &[&$crate::store::ActionTarget],
        ) -> Result<Vec<$crate::actions::Applied>, sqlx::Error> {
            use $crate::store::actions::OncePerKey;
            if targets.is_empty() {
                return Ok(Vec::new());
            }
            // One row per key: rows of one statement must not conflict with each other.
            let mut seen = std::collections::HashSet::new();
            let mut rows: Vec<_> = targets
                .iter()
                .filter(|t| seen.insert(kind.key(t)))
                .collect();
            // Concurrent batches take the keys' index locks in one order: no deadlock cycle.
            rows.sort_by_key(|t| kind.key(t));
            let mut q = sqlx::QueryBuilder::<Db>::new(kind.insert());
            q.push_values(rows, |mut row, t| {
                let (tenant, key) = kind.key(t);
                row.push_bind(tenant)
                    .push_bind(key)
                    .push_bind(t.event_id)
                    .push_bind(t.now);
                if kind == OncePerKey::Ledger {
                    row.push_bind(uuid::Uuid::now_v7())
                        .push_bind(t.subject_hash.clone())
                        .push_bind("step_up_verification");
                }
            });
            q.push(kind.returning());
            let inserted: Vec<(uuid::Uuid, Vec<u8>, uuid::Uuid)> =
                q.build_query_as().fetch_all(&mut *conn).await?;
            let mut holder: std::collections::HashMap<_, _> =
                inserted.into_iter().map(|(t, k, e)| ((t, k), e)).collect();
            let missing: Vec<_> = targets
                .iter()
                .map(|t| kind.key(t))
                .filter(|k| !holder.contains_key(k))
                .collect::<std::collections::HashSet<_>>()
                .into_iter()
                .collect();
            holder.extend(holders_of(conn, kind.holders(), &missing).await?);
            Ok(targets
                .iter()
                .map(|t| applied(holder.get(&kind.key(t)) == Some(&t.event_id)))
                .collect())
        }

        /// `Done` when the target's own event holds the effect.
        // Only SQLite runs this; PostgreSQL fuses it into store/postgres_pipeline/.
        #[allow(dead_code)]
        fn applied(ours: bool) -> $crate::actions::Applied {
            if ours {
                $crate::actions::Applied::Done
            } else {
                $crate::actions::Applied::AlreadyDone
            }
        }

        /// Opens a case per subject, or attaches each event to its subject's open case.
        // Only SQLite runs this; PostgreSQL fuses it into store/postgres_pipeline/.
        #[allow(dead_code)]
        async fn apply_open_case(
            conn: &mut $conn,
            targets: &[&$crate::store::ActionTarget],
        ) -> Result<Vec<$crate::actions::Applied>, sqlx::Error> {
            if targets.is_empty() {
                return Ok(Vec::new());
            }
            let key = |t: &$crate::store::ActionTarget| (t.tenant_id, t.subject_hash.clone());
            let mut seen = std::collections::HashSet::new();
            let mut rows: Vec<_> = targets.iter().filter(|t| seen.insert(key(t))).collect();
            rows.sort_by_key(|t| key(t));
            let mut q = sqlx::QueryBuilder::<Db>::new(
                "INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, \
                 opened_at) ",
            );
            q.push_values(rows, |mut row, t| {
                row.push_bind(uuid::Uuid::now_v7())
                    .push_bind(t.tenant_id)
                    .push_bind(t.subject_hash.clone())
                    .push_bind("open")
                    .push_bind(t.event_id)
                    .push_bind(t.now);
            });
            q.push(" ON CONFLICT DO NOTHING RETURNING tenant_id, subject_hash, id, opened_by_event");
            let opened: Vec<(uuid::Uuid, Vec<u8>, uuid::Uuid, uuid::Uuid)> =
                q.build_query_as().fetch_all(&mut *conn).await?;
            let mut open: std::collections::HashMap<_, _> = opened
                .into_iter()
                .map(|(t, s, id, opener)| ((t, s), (id, opener)))
                .collect();
            // The open case of every other subject: an earlier one.
            let missing: Vec<_> = seen.into_iter().filter(|k| !open.contains_key(k)).collect();
            if !missing.is_empty() {
                let mut q = sqlx::QueryBuilder::<Db>::new(
                    "SELECT tenant_id, subject_hash, id, opened_by_event FROM cases \
                     WHERE status = 'open' AND (tenant_id, subject_hash) IN ",
                );
                push_keys(&mut q, &missing);
                let earlier: Vec<(uuid::Uuid, Vec<u8>, uuid::Uuid, uuid::Uuid)> =
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
                    outcomes.push($crate::actions::Applied::AlreadyDone);
                    continue;
                };
                attach.push((case_id, t.event_id, t.now));
                outcomes.push(applied(opener == t.event_id));
            }
            if !attach.is_empty() {
                let mut q = sqlx::QueryBuilder::<Db>::new(
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
        /// event), then records the alert of each event that holds its window.
        // Only SQLite runs this; PostgreSQL fuses it into store/postgres_pipeline/.
        #[allow(dead_code)]
        async fn apply_alert_customer(
            conn: &mut $conn,
            targets: &[&$crate::store::ActionTarget],
            window_ms: i64,
        ) -> Result<Vec<$crate::actions::Applied>, sqlx::Error> {
            if targets.is_empty() {
                return Ok(Vec::new());
            }
            let key = |t: &$crate::store::ActionTarget| {
                (t.tenant_id, t.subject_hash.clone(), t.signal_type)
            };
            let mut seen = std::collections::HashSet::new();
            let mut rows: Vec<_> = targets.iter().filter(|t| seen.insert(key(t))).collect();
            rows.sort_by_key(|t| key(t));
            let mut q = sqlx::QueryBuilder::<Db>::new(
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
            let claimed: Vec<(uuid::Uuid, Vec<u8>, String, uuid::Uuid)> =
                q.build_query_as().fetch_all(&mut *conn).await?;
            let mut holder: std::collections::HashMap<_, _> = claimed
                .into_iter()
                .map(|(t, s, ty, e)| ((t, s, ty), e))
                .collect();
            // Who holds each window this statement did not claim.
            let missing: Vec<_> = seen
                .iter()
                .filter(|(t, s, ty)| !holder.contains_key(&(*t, s.clone(), (*ty).to_owned())))
                .collect();
            if !missing.is_empty() {
                let mut q = sqlx::QueryBuilder::<Db>::new(
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
                let held: Vec<(uuid::Uuid, Vec<u8>, String, uuid::Uuid)> =
                    q.build_query_as().fetch_all(&mut *conn).await?;
                holder.extend(held.into_iter().map(|(t, s, ty, e)| ((t, s, ty), e)));
            }
            let ours: Vec<bool> = targets
                .iter()
                .map(|t| {
                    holder.get(&(t.tenant_id, t.subject_hash.clone(), t.signal_type.to_owned()))
                        == Some(&t.event_id)
                })
                .collect();
            let sent: Vec<_> = targets
                .iter()
                .zip(&ours)
                .filter(|(_, ours)| **ours)
                .map(|(t, _)| t)
                .collect();
            if !sent.is_empty() {
                let mut q = sqlx::QueryBuilder::<Db>::new(
                    "INSERT INTO alerts (tenant_id, subject_hash, signal_type, event_id, sent_at) ",
                );
                q.push_values(sent, |mut row, t| {
                    row.push_bind(t.tenant_id)
                        .push_bind(t.subject_hash.clone())
                        .push_bind(t.signal_type)
                        .push_bind(t.event_id)
                        .push_bind(t.now);
                });
                q.push(" ON CONFLICT DO NOTHING");
                q.build().execute(&mut *conn).await?;
            }
            Ok(ours.into_iter().map(applied).collect())
        }

        /// Deletes the record of the alerts `events` sent: history, not state (the window
        /// guard is `alert_windows`, which stays).
        async fn delete_sent_alerts(
            conn: &mut $conn,
            events: &[uuid::Uuid],
        ) -> Result<u64, sqlx::Error> {
            let mut q = sqlx::QueryBuilder::<Db>::new("DELETE FROM alerts WHERE event_id IN ");
            push_ids(&mut q, events);
            Ok(q.build().execute(&mut *conn).await?.rows_affected())
        }

        #[async_trait::async_trait]
        impl $crate::store::ActionStore for $store {
            async fn subject(
                &self,
                tenant_id: uuid::Uuid,
                subject_hash: &[u8],
            ) -> Result<Option<$crate::store::SubjectState>, $crate::store::StoreError> {
                let known: Option<uuid::Uuid> = sqlx::query_scalar(
                    "SELECT id FROM events WHERE tenant_id = $1 AND subject_hash = $2 LIMIT 1",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?;
                if known.is_none() {
                    return Ok(None);
                }
                let lock = sqlx::query_as(
                    "SELECT event_id, locked_at FROM account_locks \
                     WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?;
                let deny = sqlx::query_as(
                    "SELECT event_id, issued_at FROM denies WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?;
                let rows: Vec<(uuid::Uuid, i64, uuid::Uuid)> = sqlx::query_as(
                    "SELECT c.id, c.opened_at, e.event_id FROM cases c \
                     JOIN case_events e ON e.case_id = c.id \
                     WHERE c.tenant_id = $1 AND c.subject_hash = $2 AND c.status = 'open' \
                     ORDER BY c.id, e.event_id",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_all(self.read())
                .await?;
                let mut open_cases: Vec<(uuid::Uuid, i64, Vec<uuid::Uuid>)> = Vec::new();
                for (id, opened_at, event) in rows {
                    match open_cases.last_mut() {
                        Some(case) if case.0 == id => case.2.push(event),
                        _ => open_cases.push((id, opened_at, vec![event])),
                    }
                }
                Ok(Some($crate::store::SubjectState {
                    lock,
                    open_cases,
                    deny,
                }))
            }
        }
    };
}
