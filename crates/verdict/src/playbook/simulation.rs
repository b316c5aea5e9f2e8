//! "What would this playbook have decided": a candidate run against stored events, exactly.
//!
//! Each event keeps what its decision evaluated (the signal's type, time and attributes, the
//! subject facts and the evaluation time), so the candidate sees the very inputs the playbook in
//! force saw. Nothing is claimed, written or acted on.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Decision, Observation, Playbook, SubjectFacts};
use crate::domain::ActionKind;
use crate::signal::SignalType;
use crate::store::{EventRecord, EventStore, StoreError};

/// Most events one simulation may read.
pub const MAX_SIMULATED_EVENTS: usize = 10_000;
/// Events simulated when the request names no limit.
pub const DEFAULT_SIMULATED_EVENTS: usize = 1_000;
/// Events read per page.
const PAGE: usize = 500;

/// Which events to simulate: the newest `limit` created at or after `since` (unix ms).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub since: Option<i64>,
    pub limit: usize,
}

/// A decision, as given or as the candidate would give it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Outcome {
    pub decision: Decision,
    pub rule: String,
    pub actions: Vec<ActionKind>,
}

/// One event: what it was given, and what the candidate would give.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Comparison {
    pub event_id: Uuid,
    pub signal_type: SignalType,
    /// Unix milliseconds.
    pub created_at: i64,
    pub actual: Outcome,
    pub candidate: Outcome,
    pub changed: bool,
}

/// How many events moved from one rule and decision to another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Change {
    pub from_rule: String,
    pub from_decision: Decision,
    pub to_rule: String,
    pub to_decision: Decision,
    pub events: usize,
}

/// The whole answer: a summary, then every event compared.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Simulation {
    /// Events compared.
    pub examined: usize,
    /// Events whose decision, rule or actions would differ.
    pub changed: usize,
    /// Events stored before evaluation times were recorded: their creation time stands in,
    /// so their comparison may be inexact.
    pub inexact: usize,
    /// The changes counted from what to what, most frequent first.
    pub changes: Vec<Change>,
    pub events: Vec<Comparison>,
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("event {0} could not be read back: {1}")]
    Unreadable(Uuid, String),
    #[error(transparent)]
    AlreadyRunning(#[from] AlreadyRunning),
}

/// Simulations across tenants that evaluate at once; more wait their turn (within the request
/// deadline), so simulating never takes more than this share of the CPU from signals.
const AT_ONCE: usize = 1;

/// The simulations running now: at most one per tenant (another is refused while it runs)
/// and [`AT_ONCE`] evaluating across tenants.
pub struct Simulations {
    running: std::sync::Mutex<std::collections::HashSet<Uuid>>,
    evaluating: tokio::sync::Semaphore,
}

impl Default for Simulations {
    fn default() -> Self {
        Self {
            running: Default::default(),
            evaluating: tokio::sync::Semaphore::new(AT_ONCE),
        }
    }
}

/// A tenant's simulation is already running.
#[derive(Debug, thiserror::Error)]
#[error("a simulation of this tenant's playbook is already running; retry when it is done")]
pub struct AlreadyRunning;

impl Simulations {
    /// Runs `candidate` over the tenant's events in `window` as [`simulate`] does, unless one
    /// of the tenant's is running; waits for its turn among the other tenants'.
    pub async fn run(
        &self,
        store: &(dyn EventStore + Send + Sync),
        tenant_id: Uuid,
        candidate: &Playbook,
        window: Window,
    ) -> Result<Simulation, SimulationError> {
        let _running = self.begin(tenant_id)?;
        let _turn = self
            .evaluating
            .acquire()
            .await
            .map_err(|_| AlreadyRunning)?;
        simulate(store, tenant_id, candidate, window).await
    }

    fn begin(&self, tenant_id: Uuid) -> Result<Running<'_>, AlreadyRunning> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if !running.insert(tenant_id) {
            return Err(AlreadyRunning);
        }
        Ok(Running {
            simulations: self,
            tenant_id,
        })
    }
}

/// A tenant's running simulation, until dropped.
struct Running<'a> {
    simulations: &'a Simulations,
    tenant_id: Uuid,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self
            .simulations
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        running.remove(&self.tenant_id);
    }
}

/// Runs `candidate` over the tenant's events in `window`, newest first.
pub async fn simulate(
    store: &(dyn EventStore + Send + Sync),
    tenant_id: Uuid,
    candidate: &Playbook,
    window: Window,
) -> Result<Simulation, SimulationError> {
    let limit = window.limit.clamp(1, MAX_SIMULATED_EVENTS);
    let mut comparisons = Vec::new();
    let mut inexact = 0;
    let mut before = None;
    'pages: while comparisons.len() < limit {
        // Tests hold a simulation here to show what runs beside it.
        crate::store::failpoint::failpoint!("simulation::page");
        let want = PAGE.min(limit - comparisons.len());
        let page = store.events(tenant_id, before, want as i64).await?;
        for event in &page {
            if window.since.is_some_and(|since| event.created_at < since) {
                break 'pages;
            }
            // A feed event no signal type mapped decided nothing: there is nothing to compare.
            if event.decision == Decision::Ignored {
                continue;
            }
            let stored = Stored::read(event)?;
            inexact += usize::from(event.evaluated_at == 0);
            comparisons.push(stored.compare(event, candidate));
        }
        if page.len() < want {
            break;
        }
        before = page.last().map(|e| e.id);
        // A page evaluated is a few milliseconds of CPU: let the runtime's other tasks in.
        tokio::task::yield_now().await;
    }
    Ok(summarise(comparisons, inexact))
}

/// An action result as an event stores it; its outcome does not matter here.
#[derive(serde::Deserialize)]
struct StoredAction {
    action: ActionKind,
}

/// An event's stored inputs and outcome, decoded.
struct Stored {
    signal_type: SignalType,
    observed_at: OffsetDateTime,
    attributes: Map<String, Value>,
    facts: SubjectFacts,
    evaluated_at: OffsetDateTime,
    actual: Outcome,
}

impl Stored {
    fn read(event: &EventRecord) -> Result<Self, SimulationError> {
        let bad = |what: &str| SimulationError::Unreadable(event.id, what.to_owned());
        let at = |ms: i64| {
            OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                .map_err(|_| bad("a time is out of range"))
        };
        let evaluated_ms = if event.evaluated_at == 0 {
            event.created_at
        } else {
            event.evaluated_at
        };
        Ok(Self {
            signal_type: event
                .signal_type
                .parse()
                .map_err(|_| bad("unknown signal type"))?,
            observed_at: at(event.observed_at)?,
            attributes: serde_json::from_str(&event.attributes)
                .map_err(|_| bad("attributes are not a JSON object"))?,
            facts: serde_json::from_str(&event.facts).map_err(|_| bad("facts are not JSON"))?,
            evaluated_at: at(evaluated_ms)?,
            actual: Outcome {
                decision: event.decision,
                rule: event.rule.clone(),
                actions: serde_json::from_str::<Vec<StoredAction>>(&event.actions())
                    .map_err(|_| bad("actions are not a list of action results"))?
                    .into_iter()
                    .map(|a| a.action)
                    .collect(),
            },
        })
    }

    fn compare(self, event: &EventRecord, candidate: &Playbook) -> Comparison {
        let observation = Observation {
            signal_type: self.signal_type,
            observed_at: self.observed_at,
            attributes: &self.attributes,
        };
        let ruling = candidate.decide_observed(&observation, self.facts, self.evaluated_at);
        let candidate = Outcome {
            decision: ruling.decision,
            rule: ruling.rule,
            actions: ruling.actions,
        };
        Comparison {
            event_id: event.id,
            signal_type: self.signal_type,
            created_at: event.created_at,
            changed: candidate != self.actual,
            actual: self.actual,
            candidate,
        }
    }
}

impl Simulation {
    /// The summary as a plain-text table, for the CLI.
    pub fn summary_table(&self) -> String {
        use std::fmt::Write;
        let mut out = format!(
            "{} events examined, {} would change{}\n",
            self.examined,
            self.changed,
            if self.inexact > 0 {
                format!(
                    " ({} stored before evaluation times were kept: inexact)",
                    self.inexact
                )
            } else {
                String::new()
            }
        );
        if self.changes.is_empty() {
            return out;
        }
        let rows: Vec<[String; 3]> = self
            .changes
            .iter()
            .map(|c| {
                [
                    format!("{} ({})", c.from_rule, c.from_decision.as_str()),
                    format!("{} ({})", c.to_rule, c.to_decision.as_str()),
                    c.events.to_string(),
                ]
            })
            .collect();
        let header = ["from", "to", "events"];
        let width = |i: usize| {
            rows.iter()
                .map(|r| r[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        };
        let (a, b, c) = (width(0), width(1), width(2));
        let _ = writeln!(
            out,
            "{:<a$}  {:<b$}  {:>c$}",
            header[0], header[1], header[2]
        );
        for [from, to, n] in &rows {
            let _ = writeln!(out, "{from:<a$}  {to:<b$}  {n:>c$}");
        }
        out
    }
}

fn summarise(events: Vec<Comparison>, inexact: usize) -> Simulation {
    let mut counted: BTreeMap<(String, &str, String, &str), (Change, usize)> = BTreeMap::new();
    for c in events.iter().filter(|c| c.changed) {
        let key = (
            c.actual.rule.clone(),
            c.actual.decision.as_str(),
            c.candidate.rule.clone(),
            c.candidate.decision.as_str(),
        );
        counted
            .entry(key)
            .or_insert_with(|| {
                let change = Change {
                    from_rule: c.actual.rule.clone(),
                    from_decision: c.actual.decision,
                    to_rule: c.candidate.rule.clone(),
                    to_decision: c.candidate.decision,
                    events: 0,
                };
                (change, 0)
            })
            .1 += 1;
    }
    let mut changes: Vec<Change> = counted
        .into_values()
        .map(|(change, n)| Change {
            events: n,
            ..change
        })
        .collect();
    changes.sort_by_key(|c| std::cmp::Reverse(c.events));
    Simulation {
        examined: events.len(),
        changed: events.iter().filter(|c| c.changed).count(),
        inexact,
        changes,
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Feed;
    use crate::playbook::Format;

    fn event(
        rule: &str,
        decision: &str,
        actions: &str,
        facts: &str,
        age_hours: i64,
    ) -> EventRecord {
        let now = 1_800_000_000_000;
        EventRecord {
            id: Uuid::now_v7(),
            signal_type: "sim_swap".into(),
            subject_hash: vec![0; 32],
            observed_at: now - age_hours * 3_600_000,
            attributes: r#"{"carrier":"x"}"#.into(),
            stored_metadata: "{}".into(),
            decision: decision.parse().unwrap(),
            playbook_version: 1,
            rule: rule.into(),
            stored_actions: actions.into(),
            created_at: now,
            evaluated_at: now,
            facts: facts.into(),
            feed: Feed::Signals,
            signal_key: Vec::new(),
            callback_payload: None,
        }
    }

    fn results(actions: &[&str]) -> String {
        let list: Vec<Value> = actions
            .iter()
            .map(|a| serde_json::json!({"action": a, "outcome": "done"}))
            .collect();
        Value::Array(list).to_string()
    }

    #[test]
    fn a_stored_event_decides_again_exactly_with_the_facts_it_saw() {
        let default = Playbook::default_playbook();
        // Under the default playbook: a recent swap on an unlocked subject, a locked one, an
        // old one. The candidate drops the locked-subject rule.
        let history = [
            event(
                "recent_sim_swap",
                "deny",
                &results(&[
                    "lock_account",
                    "open_case",
                    "alert_customer",
                    "deny",
                    "callback",
                ]),
                r#"{"locked":false}"#,
                1,
            ),
            event(
                "subject_already_locked",
                "deny",
                &results(&["deny", "open_case", "callback"]),
                r#"{"locked":true}"#,
                100,
            ),
        ];
        for e in &history {
            let stored = Stored::read(e).unwrap();
            let same = stored.compare(e, default);
            assert!(
                !same.changed,
                "the playbook in force must reproduce {}: {same:?}",
                e.rule
            );
        }
        let candidate = Playbook::parse(
            "[[rule]]\nname = \"recent_sim_swap\"\nwhen = { type = [\"sim_swap\"], observed_within_hours = 24 }\ndecision = \"deny\"\nactions = [\"lock_account\", \"open_case\", \"alert_customer\", \"deny\", \"callback\"]\n",
            Format::Toml,
        )
        .unwrap();
        let compared: Vec<Comparison> = history
            .iter()
            .map(|e| Stored::read(e).unwrap().compare(e, &candidate))
            .collect();
        let summary = summarise(compared, 0);
        assert_eq!((summary.examined, summary.changed), (2, 1));
        assert_eq!(summary.changes[0].from_rule, "subject_already_locked");
        assert_eq!(summary.changes[0].to_rule, "no_rule_matched");
        assert_eq!(summary.changes[0].to_decision, Decision::Allow);
    }
}
