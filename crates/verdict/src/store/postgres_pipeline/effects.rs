//! Each local effect's part of [`super::apply()`], in one place per action: the CTEs
//! that write it for the live acts that ask for it (`live`, with a boolean column named after
//! the action), its clause in `expected` (the act's row is this event's, written now), and the
//! query that reports, per act, whether the effect is the act's own. A new action is one arm
//! of [`effect`]; the statement is assembled from every [`ActionKind::LOCAL`].

use crate::domain::ActionKind;

/// One action's SQL in [`super::apply()`].
pub(super) struct Effect {
    /// CTEs, each starting `, name AS (` and ending `)`, that write the effect. A part that
    /// several actions share (their subject's row, [`SUBJECTS`]) is written once.
    ctes: &'static [&'static str],
    /// A condition on the act `a` that holds when this statement wrote its row for `a`.
    written: &'static str,
    /// A query of `(i, ours)` for each live act that asks for it.
    outcome: &'static str,
}

/// A subject's standing state, one row (`subjects`): its account lock, its standing deny and
/// its open case, each taken by the first act (in batch order) that asks for it, unless the
/// row has it already. Written by one CTE that the three actions share. A subject whose row
/// already has everything asked (in this statement's snapshot) is left out: the insert's
/// conflict would lock that row (a `DO UPDATE` locks it even when its condition fails) and
/// make concurrent batches wait. So a hold an undo lifts meanwhile still counts as held for
/// this act, as if the act had run just before the undo (see the module above). Every row
/// the insert meets is updated, even when a concurrent batch committed everything asked after
/// this statement's snapshot: `RETURNING` then shows that row as it now stands, whose open
/// case this act's event is attached to (`case_of`), though the snapshot cannot see it.
const SUBJECTS: &str = r#"
, subject_in AS (
    SELECT tenant_id, subject_hash,
        (array_agg(event_id ORDER BY i) FILTER (WHERE lock_account))[1] AS locked_by,
        (array_agg(now ORDER BY i) FILTER (WHERE lock_account))[1] AS locked_at,
        (array_agg(event_id ORDER BY i) FILTER (WHERE deny))[1] AS denied_by,
        (array_agg(now ORDER BY i) FILTER (WHERE deny))[1] AS denied_at,
        (array_agg(case_id ORDER BY i) FILTER (WHERE open_case))[1] AS open_case,
        (array_agg(event_id ORDER BY i) FILTER (WHERE open_case))[1] AS case_opener,
        (array_agg(now ORDER BY i) FILTER (WHERE open_case))[1] AS case_opened_at
    FROM live WHERE lock_account OR deny OR open_case GROUP BY tenant_id, subject_hash
), subject_ins AS (
    INSERT INTO subjects (tenant_id, subject_hash, locked_by, locked_at, denied_by, denied_at,
        open_case)
    SELECT s.tenant_id, s.subject_hash, s.locked_by, s.locked_at, s.denied_by, s.denied_at,
        s.open_case
    FROM subject_in s
    WHERE NOT EXISTS (SELECT 1 FROM subjects x WHERE x.tenant_id = s.tenant_id
        AND x.subject_hash = s.subject_hash
        AND (s.locked_by IS NULL OR x.locked_by IS NOT NULL)
        AND (s.denied_by IS NULL OR x.denied_by IS NOT NULL)
        AND (s.open_case IS NULL OR x.open_case IS NOT NULL))
    ORDER BY s.tenant_id, s.subject_hash
    ON CONFLICT (tenant_id, subject_hash) DO UPDATE
        SET locked_by = COALESCE(subjects.locked_by, excluded.locked_by),
            locked_at = COALESCE(subjects.locked_at, excluded.locked_at),
            denied_by = COALESCE(subjects.denied_by, excluded.denied_by),
            denied_at = COALESCE(subjects.denied_at, excluded.denied_at),
            open_case = COALESCE(subjects.open_case, excluded.open_case)
    RETURNING tenant_id, subject_hash, locked_by, denied_by, open_case
)"#;

/// The SQL of a local action (the callback has none here: its outbox row is the statement's
/// own step).
fn effect(action: ActionKind) -> Option<Effect> {
    Some(match action {
        ActionKind::LockAccount => Effect {
            ctes: &[SUBJECTS],
            written: "EXISTS (SELECT 1 FROM subject_ins h WHERE h.tenant_id = a.tenant_id
            AND h.subject_hash = a.subject_hash AND h.locked_by = a.event_id)",
            outcome: "SELECT a.i, COALESCE(COALESCE(h.locked_by, (SELECT x.locked_by
        FROM subjects x WHERE x.tenant_id = a.tenant_id
        AND x.subject_hash = a.subject_hash)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN subject_ins h ON h.tenant_id = a.tenant_id AND h.subject_hash = a.subject_hash
    WHERE a.lock_account",
        },
        ActionKind::Deny => Effect {
            ctes: &[SUBJECTS],
            written: "EXISTS (SELECT 1 FROM subject_ins h WHERE h.tenant_id = a.tenant_id
            AND h.subject_hash = a.subject_hash AND h.denied_by = a.event_id)",
            outcome: "SELECT a.i, COALESCE(COALESCE(h.denied_by, (SELECT x.denied_by
        FROM subjects x WHERE x.tenant_id = a.tenant_id
        AND x.subject_hash = a.subject_hash)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN subject_ins h ON h.tenant_id = a.tenant_id AND h.subject_hash = a.subject_hash
    WHERE a.deny",
        },
        ActionKind::ChargeStepUp => Effect {
            // Keyed by the signal's time first (postgres/0031). An entry stored before that
            // whose event was pruned has no time: it is in `ledger_entries_untimed`, checked
            // here, and its event (pruned) is no act's, so the act's outcome is `already_done`.
            ctes: &[r#"
, ledger_ins AS (
    INSERT INTO ledger_entries (tenant_id, observed_at, signal_key, event_id, created_at, id,
        subject_hash, kind)
    SELECT DISTINCT ON (tenant_id, observed_at, signal_key) tenant_id, observed_at, signal_key,
        event_id, now, ledger_id, subject_hash, 'step_up_verification'
    FROM live a WHERE charge_step_up AND NOT EXISTS (SELECT 1 FROM ledger_entries_untimed x
        WHERE x.tenant_id = a.tenant_id AND x.signal_key = a.signal_key)
    ORDER BY tenant_id, observed_at, signal_key, i
    ON CONFLICT DO NOTHING RETURNING tenant_id, signal_key, event_id
)"#],
            written: "EXISTS (SELECT 1 FROM ledger_ins l
            WHERE l.tenant_id = a.tenant_id AND l.signal_key = a.signal_key
            AND l.event_id = a.event_id)",
            outcome: "SELECT a.i, COALESCE(COALESCE(l.event_id, (SELECT x.event_id
        FROM ledger_entries x WHERE x.tenant_id = a.tenant_id
        AND x.observed_at = a.observed_at AND x.signal_key = a.signal_key)) = a.event_id, FALSE)
    FROM live a
    LEFT JOIN ledger_ins l ON l.tenant_id = a.tenant_id AND l.signal_key = a.signal_key
    WHERE a.charge_step_up",
        },
        ActionKind::OpenCase => Effect {
            ctes: &[
                SUBJECTS,
                r#"
, case_ins AS (
    -- The cases this statement opened: their subject's row took the new case's id.
    INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, opened_at)
    SELECT took.open_case, took.tenant_id, took.subject_hash, 'open', asked.case_opener,
        asked.case_opened_at
    FROM subject_ins took JOIN subject_in asked ON asked.tenant_id = took.tenant_id
        AND asked.subject_hash = took.subject_hash AND asked.open_case = took.open_case
    RETURNING id, tenant_id, subject_hash, opened_by_event
), case_of AS (
    -- The subject's open case as the insert left its row (`took`), else as the snapshot shows
    -- it. Its opener is known where this statement opened it or the snapshot holds it; a case
    -- a concurrent batch opened after the snapshot is another event's (this event's acts run
    -- one at a time), so it has none here, and the event is attached to it.
    SELECT a.i, a.event_id, a.now, COALESCE(took.open_case, x.id) AS case_id,
        CASE WHEN c.id IS NOT NULL THEN c.opened_by_event
            WHEN took.open_case IS NULL OR took.open_case = x.id THEN x.opened_by_event
        END AS opener
    FROM live a
    LEFT JOIN subject_ins took
        ON took.tenant_id = a.tenant_id AND took.subject_hash = a.subject_hash
    LEFT JOIN case_ins c ON c.id = took.open_case
    LEFT JOIN (subjects held JOIN cases x ON x.id = held.open_case)
        ON held.tenant_id = a.tenant_id AND held.subject_hash = a.subject_hash
    WHERE a.open_case
), case_attached AS (
    -- The events after the opener (the case holds its opener).
    INSERT INTO case_events (case_id, event_id, attached_at)
    SELECT case_id, event_id, now FROM case_of
    WHERE case_id IS NOT NULL AND opener IS DISTINCT FROM event_id
    ORDER BY case_id, event_id
    ON CONFLICT DO NOTHING
)"#,
            ],
            written: "EXISTS (SELECT 1 FROM case_ins c
            WHERE c.tenant_id = a.tenant_id AND c.subject_hash = a.subject_hash
            AND c.opened_by_event = a.event_id)",
            outcome: "SELECT i, COALESCE(opener = event_id, FALSE) FROM case_of",
        },
        ActionKind::AlertCustomer => Effect {
            ctes: &[r#"
, alert_ins AS (
    -- Claims each subject's alert window: inserted, or moved to this event once it expired.
    INSERT INTO alert_windows (tenant_id, subject_hash, signal_type, event_id, last_sent_at)
    SELECT DISTINCT ON (tenant_id, subject_hash, signal_type) tenant_id, subject_hash,
        signal_type, event_id, now
    FROM live WHERE alert_customer ORDER BY tenant_id, subject_hash, signal_type, i
    ON CONFLICT (tenant_id, subject_hash, signal_type) DO UPDATE
        SET event_id = excluded.event_id, last_sent_at = excluded.last_sent_at
        WHERE alert_windows.last_sent_at <= excluded.last_sent_at - {alert_window}
    RETURNING tenant_id, subject_hash, signal_type, event_id
), alert_of AS (
    -- An act whose event holds its window alerted: the window row and the event's action
    -- outcome are the alert's record.
    SELECT a.i,
        COALESCE(COALESCE(w.event_id, (SELECT x.event_id FROM alert_windows x
            WHERE x.tenant_id = a.tenant_id AND x.subject_hash = a.subject_hash
            AND x.signal_type = a.signal_type)) = a.event_id, FALSE) AS ours
    FROM live a
    LEFT JOIN alert_ins w ON w.tenant_id = a.tenant_id AND w.subject_hash = a.subject_hash
        AND w.signal_type = a.signal_type
    WHERE a.alert_customer
)"#],
            written: "EXISTS (SELECT 1 FROM alert_ins w WHERE w.tenant_id = a.tenant_id
            AND w.subject_hash = a.subject_hash AND w.signal_type = a.signal_type
            AND w.event_id = a.event_id)",
            outcome: "SELECT i, ours FROM alert_of",
        },
        ActionKind::Callback
        | ActionKind::UnlockAccount
        | ActionKind::LiftDeny
        | ActionKind::CloseCase
        | ActionKind::Custom(_) => return None,
    })
}

/// A set of local actions: bit `n` stands for the `n`th of [`ActionKind::LOCAL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EffectSet(u8);

// A ninth local action needs a wider set.
const _: () = assert!(ActionKind::LOCAL.len() <= 8);

impl EffectSet {
    /// How many sets there are: one statement is rendered for each.
    pub(super) const COUNT: usize = 1 << ActionKind::LOCAL.len();

    /// The local actions any of `asks` asks for.
    pub(super) fn asked<'a>(asks: impl IntoIterator<Item = &'a [ActionKind]>) -> Self {
        let mut bits = 0;
        for effects in asks {
            for (n, action) in ActionKind::LOCAL.iter().enumerate() {
                if effects.contains(action) {
                    bits |= 1 << n;
                }
            }
        }
        Self(bits)
    }

    /// Every set, in [`Self::index`] order.
    #[cfg(test)]
    pub(super) fn all() -> impl Iterator<Item = Self> {
        (0..Self::COUNT).filter_map(|bits| u8::try_from(bits).ok().map(Self))
    }

    /// Its position among [`Self::all`].
    pub(super) fn index(self) -> usize {
        usize::from(self.0)
    }

    /// Whether it holds `action`.
    pub(super) fn contains(self, action: ActionKind) -> bool {
        ActionKind::LOCAL
            .iter()
            .position(|local| *local == action)
            .is_some_and(|n| self.0 & (1 << n) != 0)
    }
}

/// The local actions in `set` with their SQL, in [`ActionKind::LOCAL`] order.
fn effects(set: EffectSet) -> impl Iterator<Item = (ActionKind, Effect)> {
    ActionKind::LOCAL
        .into_iter()
        .filter(move |action| set.contains(*action))
        .filter_map(|action| effect(action).map(|sql| (action, sql)))
}

/// `template` with `{effects}` (the CTEs of every action in `set`), `{effects_written}` (their
/// `expected` conditions) and `{effects_outcomes}` (their reported rows) filled in. A batch's
/// statement holds only the effects its acts ask for: every CTE of a statement is set up each
/// time it runs, asked for or not, and that set-up was a sixth of the database's time per
/// signal (`perf`, `standard_ExecutorStart`).
pub(super) fn assemble(template: &str, set: EffectSet) -> String {
    // A part that several actions share (their subject's row) is written once.
    let mut ctes: Vec<&str> = Vec::new();
    for part in effects(set).flat_map(|(_, e)| e.ctes) {
        if !ctes.contains(part) {
            ctes.push(part);
        }
    }
    let ctes = ctes.concat();
    let written: Vec<String> = effects(set)
        .map(|(action, e)| format!("(NOT a.{} OR {})", action.as_str(), e.written))
        .collect();
    let written = if written.is_empty() {
        "TRUE".to_owned()
    } else {
        written.join("\n        AND ")
    };
    let outcomes: String = effects(set)
        .map(|(action, e)| {
            format!(
                "UNION ALL SELECT '{}', o.* FROM ({}) AS o\n",
                action.as_str(),
                e.outcome
            )
        })
        .collect();
    template
        .replacen("{effects}", &ctes, 1)
        .replacen("{effects_written}", &written, 1)
        .replacen("{effects_outcomes}", &outcomes, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_holds_the_actions_asked_for_and_no_other() {
        let set = EffectSet::asked([
            &[ActionKind::Deny, ActionKind::Callback][..],
            &[ActionKind::AlertCustomer][..],
        ]);
        for action in ActionKind::LOCAL {
            assert_eq!(
                set.contains(action),
                matches!(action, ActionKind::Deny | ActionKind::AlertCustomer),
                "{action:?}"
            );
        }
        assert_eq!(EffectSet::all().count(), EffectSet::COUNT);
        assert!(EffectSet::all().enumerate().all(|(n, s)| s.index() == n));
    }
}
