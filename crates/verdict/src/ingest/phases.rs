//! Where a signal's time goes: each phase of its ingest timed into one histogram,
//! `verdict_ingest_phase_seconds`, by phase; and each group commit's round trip into
//! `verdict_group_commit_seconds`. A request's latency is, nearly all of it, its decision,
//! its wait for a batch and that batch's commit, and its inline attempts.

use std::sync::LazyLock;
use std::time::Instant;

/// A phase of a signal's ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// The decision: the subject's facts read (shared with the reads in flight), the playbook
    /// applied.
    Decide,
    /// The act's wait for a group commit and that batch's commit.
    Commit,
    /// The callbacks' inline attempts, up to their deadline.
    Inline,
}

// Registered once: looking a histogram up by name on every signal costs more than recording.
static DECIDE: LazyLock<metrics::Histogram> = LazyLock::new(|| phase_histogram("decide"));
static COMMIT: LazyLock<metrics::Histogram> = LazyLock::new(|| phase_histogram("commit"));
static INLINE: LazyLock<metrics::Histogram> = LazyLock::new(|| phase_histogram("inline"));
static BATCH: LazyLock<metrics::Histogram> =
    LazyLock::new(|| metrics::histogram!("verdict_group_commit_seconds"));

fn phase_histogram(phase: &'static str) -> metrics::Histogram {
    metrics::histogram!("verdict_ingest_phase_seconds", "phase" => phase)
}

impl Phase {
    fn histogram(self) -> &'static metrics::Histogram {
        match self {
            Phase::Decide => &DECIDE,
            Phase::Commit => &COMMIT,
            Phase::Inline => &INLINE,
        }
    }
}

/// Runs `work`, recording how long it took as `phase`.
pub(super) async fn timed<T>(phase: Phase, work: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = work.await;
    phase.histogram().record(started.elapsed());
    out
}

/// Records one group commit's round trip (its statements and commit, retries included).
pub(super) fn batch_committed(started: Instant) {
    BATCH.record(started.elapsed());
}
