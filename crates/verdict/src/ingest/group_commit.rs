//! Group commit: the claims and effects of the signals in flight share one transaction and one
//! commit, so throughput is not bounded by one commit per signal.
//!
//! Requests queue their work; a committer takes whatever is queued (up to [`MAX_BATCH`]) the
//! moment it is free. On PostgreSQL, a committer that found nothing queued also waits, for a
//! moment (the store's gathering), for the requests already on their way ([`Approach`]:
//! deciding, their work not yet queued), so that at low concurrency signals still share
//! commits; a lone signal has no one to wait for and waits for nothing. Each request still
//! gets its own outcome. A batch that fails for a reason that is not transient is retried one
//! signal at a time, so one bad signal never fails the others.
//!
//! Work no request waits for (an inline attempt's record, made after the response) is held
//! back instead: it rides in the next batch a request's work starts, or commits on its own
//! once it waited [`LINGER`]. A batch costs the database far more to start and commit than
//! a record costs inside one, so records on their own were a third of all batches.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, mpsc, oneshot};
use tokio::time::Instant;

use super::approach::{Approach, Gathering, take};
use super::phases;

use crate::store::{
    Act, AttemptRecord, Batch, BatchResult, CallsDone, Claim, Committed, PipelineStore, StoreError,
};

/// Most signals' work in one commit: the store's limit.
pub use crate::store::MAX_BATCH;
/// Work waiting for a committer before requests wait to queue.
const QUEUE: usize = 4096;
/// Longest a record no request waits for is held back for a request's batch to ride in.
/// Far inside the lease that keeps its delivery from a worker meanwhile.
pub const LINGER: Duration = Duration::from_millis(25);

enum Job {
    Claim(Box<Claim>, oneshot::Sender<Result<bool, StoreError>>),
    Act(
        Box<Act>,
        oneshot::Sender<Shared<Result<Committed, StoreError>>>,
    ),
    Attempt(Box<AttemptRecord>, oneshot::Sender<Result<(), StoreError>>),
    CallsDone(Box<CallsDone>, oneshot::Sender<Result<(), StoreError>>),
}

/// A job's answer, and how many signals' work its commit carried (the job's own included): a
/// trace shows one request's `commit` span as the share of a batch that it is.
pub struct Shared<T> {
    pub answer: T,
    pub signals: usize,
}

/// The queue in front of the committers.
pub struct GroupCommit {
    jobs: mpsc::Sender<Job>,
    deferred: mpsc::Sender<(Instant, Job)>,
    /// `None` when the store does not gather: then nothing reads a count of requests on their
    /// way, and none is kept.
    gathering: Option<Gathering>,
}

/// What the committers take their batches from; one committer at a time holds it.
struct Queues {
    /// Work a request waits for.
    urgent: mpsc::Receiver<Job>,
    /// Work no request waits for, with when it arrived.
    deferred: mpsc::Receiver<(Instant, Job)>,
    /// Deferred work taken off its channel, oldest first: at most [`MAX_BATCH`], so the
    /// channel's bound holds back the rest.
    held: VecDeque<(Instant, Job)>,
    deferred_open: bool,
    /// How long a committer that found nothing queued waits for the requests on their way.
    gathering: Option<Gathering>,
}

impl GroupCommit {
    /// Starts `committers` committers (the store's number: one on SQLite), which gather for
    /// `gather` (the store's) when idle.
    pub fn start(
        store: Arc<dyn PipelineStore>,
        committers: usize,
        gather: Option<Duration>,
        alert_window_ms: i64,
    ) -> Self {
        let (jobs, urgent) = mpsc::channel(QUEUE);
        let (deferred, deferred_jobs) = mpsc::channel(QUEUE);
        let gathering = Gathering::new(gather);
        let queue = Arc::new(Mutex::new(Queues {
            urgent,
            deferred: deferred_jobs,
            held: VecDeque::new(),
            deferred_open: true,
            gathering: gathering.clone(),
        }));
        for _ in 0..committers.max(1) {
            tokio::spawn(committer(store.clone(), queue.clone(), alert_window_ms));
        }
        Self {
            jobs,
            deferred,
            gathering,
        }
    }

    /// Counts a request on its way to the queue, until the [`Approach`] arrives or is dropped;
    /// counts nothing if the store does not gather.
    pub fn approach(&self) -> Approach {
        self.gathering
            .as_ref()
            .map_or_else(Approach::none, Gathering::approach)
    }

    /// Inserts a new key's row; `false` if a row was already there.
    pub async fn claim(&self, claim: Claim, approach: &Approach) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Claim(Box::new(claim), reply), approach)
            .await?;
        answer.await.map_err(|_| stopped())?
    }

    /// Applies a decided signal's effects and stores its event and response, with its key's
    /// claim if it carries one (`Err(LockLost)` if the claim or the held lock was lost).
    pub async fn act(&self, act: Act) -> Result<Committed, StoreError> {
        self.act_shared(act, &Approach::none()).await?.answer
    }

    /// [`Self::act`] for a request on its way (`approach`), with the number of signals its
    /// commit carried.
    pub async fn act_shared(
        &self,
        act: Act,
        approach: &Approach,
    ) -> Result<Shared<Result<Committed, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Act(Box::new(act), reply), approach)
            .await?;
        answer.await.map_err(|_| stopped())
    }

    /// Records an inline callback attempt and moves its delivery on, in a batch some
    /// request's work starts (or alone after [`LINGER`]): no request waits for it.
    pub async fn record_attempt(&self, attempt: AttemptRecord) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Attempt(Box::new(attempt), reply);
        self.deferred
            .send((Instant::now(), job))
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Completes a dispatched signal once its calls answered.
    pub async fn complete_calls(&self, done: CallsDone) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::CallsDone(Box::new(done), reply), &Approach::none())
            .await?;
        answer.await.map_err(|_| stopped())?
    }

    /// Queues `job`; the request it is from (`approach`) has arrived once it is queued, not
    /// before, so a committer that sees no one on the way finds the job in the queue.
    async fn submit(&self, job: Job, approach: &Approach) -> Result<(), StoreError> {
        let sent = self.jobs.send(job).await.map_err(|_| stopped());
        approach.arrive();
        sent
    }
}

/// The committers are gone (shutting down): as transient as a lost connection.
fn stopped() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

async fn committer(store: Arc<dyn PipelineStore>, queue: Arc<Mutex<Queues>>, window: i64) {
    loop {
        let Some(jobs) = queue.lock().await.next_batch().await else {
            return;
        };
        metrics::histogram!("verdict_group_commit_signals").record(jobs.len() as f64);
        let started = std::time::Instant::now();
        let unreachable = run(&*store, jobs, window).await;
        phases::batch_committed(started);
        if let Some(unreachable) = unreachable {
            // What queued while this batch waited for the database met the same outage: it is
            // answered now (503, retry) rather than after another wait of its own, so no request
            // waits out more than one connection timeout.
            if let Ok(mut queue) = queue.try_lock() {
                let mut waiting = Vec::new();
                while let Ok(job) = queue.urgent.try_recv() {
                    waiting.push(job);
                }
                fail(waiting, unreachable);
            }
        }
    }
}

impl Queues {
    /// The next batch: the urgent work queued, then held-back work to fill it up. Waits for
    /// urgent work, or until the oldest held-back work has waited [`LINGER`] (or a whole
    /// batch of it is held). `None` once every sender is gone and nothing is left.
    async fn next_batch(&mut self) -> Option<Vec<Job>> {
        let mut jobs = Vec::new();
        // Work already queued goes at once; a committer that waits for the first job gathers.
        let idle = self.urgent.is_empty();
        loop {
            self.hold_deferred();
            let due = self.held.front().map(|(arrived, _)| *arrived + LINGER);
            if self.held.len() >= MAX_BATCH || due.is_some_and(|due| due <= Instant::now()) {
                // Its wait is over: it goes first, so a flood of urgent work cannot starve it.
                self.take_held(&mut jobs);
                break;
            }
            tokio::select! {
                biased;
                job = self.urgent.recv() => match job {
                    Some(job) => {
                        jobs.push(job);
                        break;
                    }
                    None if self.held.is_empty() && !self.deferred_open => return None,
                    // Shutting down: what is held goes now.
                    None => {
                        self.deferred_open = false;
                        self.hold_deferred();
                        if self.held.is_empty() {
                            return None;
                        }
                        break;
                    }
                },
                job = self.deferred.recv(), if self.deferred_open => match job {
                    Some(job) => self.held.push_back(job),
                    None => self.deferred_open = false,
                },
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => break,
            }
        }
        if let Some(gathering) = self.gathering.as_ref().filter(|_| idle && !jobs.is_empty()) {
            gathering
                .gather(&mut self.urgent, &mut jobs, MAX_BATCH)
                .await;
        }
        take(&mut self.urgent, &mut jobs, MAX_BATCH);
        self.take_held(&mut jobs);
        Some(jobs)
    }

    /// Fills `jobs` up to [`MAX_BATCH`] with held-back work, oldest first.
    fn take_held(&mut self, jobs: &mut Vec<Job>) {
        while jobs.len() < MAX_BATCH {
            self.hold_deferred();
            match self.held.pop_front() {
                Some((_, job)) => jobs.push(job),
                None => break,
            }
        }
    }

    /// Takes deferred work off its channel while fewer than a batch of it is held.
    fn hold_deferred(&mut self) {
        while self.held.len() < MAX_BATCH {
            match self.deferred.try_recv() {
                Ok(job) => self.held.push_back(job),
                Err(_) => break,
            }
        }
    }
}

/// Commits `jobs` together, or one by one after a batch failure that is not transient. Returns
/// the failure if the batch failed because the database is unreachable.
async fn run(store: &dyn PipelineStore, jobs: Vec<Job>, window: i64) -> Option<Arc<StoreError>> {
    let batch = batch_of(&jobs, window);
    match commit(store, &batch).await {
        Ok(result) => answer(jobs, result),
        Err(err) if jobs.len() > 1 && !err.is_transient() => {
            tracing::warn!(error = ?err, signals = jobs.len(), "group commit failed; committing its signals one by one");
            for job in jobs {
                let batch = batch_of(std::slice::from_ref(&job), window);
                match commit(store, &batch).await {
                    Ok(result) => answer(vec![job], result),
                    Err(err) => fail(vec![job], Arc::new(err)),
                }
            }
        }
        Err(err) => {
            let err = Arc::new(err);
            fail(jobs, err.clone());
            return err.is_unreachable().then_some(err);
        }
    }
    None
}

/// Times a batch is run again after the database rolled it back to break a deadlock with
/// another committer's batch.
const CONFLICT_RETRIES: usize = 2;

/// Commits a batch, running it again (at most [`CONFLICT_RETRIES`] times) when the database
/// rolled it back to break a deadlock or a serialization conflict: nothing of it was stored,
/// and the other transaction has gone ahead, so its signals need not see a 503 for it. (Two
/// committers can deadlock when duplicates with different outcomes are split across their
/// batches, each inserting an outbox row the other's next statement wants.)
async fn commit(store: &dyn PipelineStore, batch: &Batch) -> Result<BatchResult, StoreError> {
    let mut retries = 0;
    loop {
        let result = match injected_conflict() {
            Some(err) => Err(err),
            None => store.commit(batch).await,
        };
        match result {
            Err(err) if err.is_conflict() && retries < CONFLICT_RETRIES => {
                retries += 1;
                metrics::counter!("verdict_group_commit_conflicts_total").increment(1);
                tracing::warn!(error = ?err, retries, "group commit rolled back by a conflict; running it again");
            }
            result => return result,
        }
    }
}

/// A deadlock the `group_commit::conflict` failpoint stands in for (tests only).
fn injected_conflict() -> Option<StoreError> {
    #[cfg(feature = "failpoints")]
    if fail::eval("group_commit::conflict", |_| ()).is_some() {
        return Some(StoreError::Unavailable(sqlx::Error::Database(Box::new(
            crate::store::failpoint::InjectedDeadlock,
        ))));
    }
    None
}

fn batch_of(jobs: &[Job], alert_window_ms: i64) -> Batch {
    let mut batch = Batch {
        alert_window_ms,
        ..Batch::default()
    };
    for job in jobs {
        match job {
            Job::Claim(claim, _) => batch.claims.push((**claim).clone()),
            Job::Act(act, _) => batch.acts.push((**act).clone()),
            Job::Attempt(attempt, _) => batch.attempts.push((**attempt).clone()),
            Job::CallsDone(done, _) => batch.calls_done.push((**done).clone()),
        }
    }
    batch
}

fn answer(jobs: Vec<Job>, result: BatchResult) {
    let signals = jobs.len();
    let mut claims = result.claims.into_iter();
    let mut acts = result.acts.into_iter();
    for job in jobs {
        // A request that went away no longer listens; its work is stored all the same.
        match job {
            Job::Claim(_, reply) => {
                let _ = reply.send(claims.next().ok_or(StoreError::LockLost));
            }
            Job::Act(_, reply) => {
                let answer = acts.next().unwrap_or(Err(StoreError::LockLost));
                let _ = reply.send(Shared { answer, signals });
            }
            Job::Attempt(_, reply) | Job::CallsDone(_, reply) => {
                let _ = reply.send(Ok(()));
            }
        }
    }
}

fn fail(jobs: Vec<Job>, err: Arc<StoreError>) {
    let signals = jobs.len();
    for job in jobs {
        let shared = StoreError::Batch(err.clone());
        match job {
            Job::Claim(_, reply) => {
                let _ = reply.send(Err(shared));
            }
            Job::Act(_, reply) => {
                let _ = reply.send(Shared {
                    answer: Err(shared),
                    signals,
                });
            }
            Job::Attempt(_, reply) | Job::CallsDone(_, reply) => {
                let _ = reply.send(Err(shared));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeliveryStatus, Next};
    use crate::store::KeyRef;
    use async_trait::async_trait;
    use uuid::Uuid;

    /// The gathering the tests' committers do, as PostgreSQL's.
    const GATHER: Duration = Duration::from_millis(2);

    /// Each batch's claims and attempts, as the committer handed them over; the first
    /// commit waits for `release`, so that work can queue behind it.
    #[derive(Default)]
    struct Recorder {
        batches: std::sync::Mutex<Vec<(usize, usize)>>,
        release: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
    }

    #[async_trait]
    impl PipelineStore for Recorder {
        async fn commit(&self, batch: &Batch) -> Result<BatchResult, StoreError> {
            let gate = self.release.lock().ok().and_then(|mut gate| gate.take());
            if let Some(gate) = gate {
                let _ = gate.await;
            }
            if let Ok(mut batches) = self.batches.lock() {
                batches.push((batch.claims.len(), batch.attempts.len()));
            }
            Ok(BatchResult {
                claims: vec![true; batch.claims.len()],
                acts: Vec::new(),
            })
        }
    }

    impl Recorder {
        fn batches(&self) -> Vec<(usize, usize)> {
            self.batches.lock().map(|b| b.clone()).unwrap_or_default()
        }
    }

    fn claim() -> Claim {
        Claim {
            key: KeyRef {
                tenant_id: Uuid::now_v7(),
                endpoint: "/v1/signals",
                digest: Uuid::now_v7().as_bytes().to_vec(),
            },
            fingerprint: vec![0; 32],
            event_id: Uuid::now_v7(),
            lock_token: Uuid::now_v7(),
            now: 1,
            locked_until: 2,
            expires_at: 3,
            ruling: "{}".to_owned(),
        }
    }

    fn record() -> AttemptRecord {
        AttemptRecord {
            id: Uuid::now_v7(),
            delivery_id: Uuid::now_v7(),
            tenant_id: Uuid::now_v7(),
            attempted_at: 1,
            trigger: crate::store::deliveries::INLINE_TRIGGER,
            status_code: Some(204),
            latency_ms: 1,
            error: None,
            response_excerpt: None,
            next: Next {
                status: DeliveryStatus::Succeeded,
                retries_left: 0,
                next_attempt_at: 1,
                disable_endpoint: false,
            },
        }
    }

    /// One committer over a recorder whose first commit (a claim) waits until the returned
    /// sender is dropped or used, with that claim already taken.
    async fn held_up() -> (Arc<Recorder>, Arc<GroupCommit>, oneshot::Sender<()>) {
        let (release, gate) = oneshot::channel();
        let store = Arc::new(Recorder::default());
        if let Ok(mut slot) = store.release.lock() {
            *slot = Some(gate);
        }
        let commits = Arc::new(GroupCommit::start(store.clone(), 1, Some(GATHER), 0));
        let first = commits.clone();
        tokio::spawn(async move { first.claim(claim(), &Approach::none()).await });
        while store.release.lock().map(|g| g.is_some()).unwrap_or(false) {
            tokio::task::yield_now().await;
        }
        (store, commits, release)
    }

    /// Records an attempt in the background, as the inline attempt's task does.
    fn spawn_record(commits: &Arc<GroupCommit>) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        let commits = commits.clone();
        tokio::spawn(async move { commits.record_attempt(record()).await })
    }

    /// Queues a whole batch of claims behind the held-up first commit, releases it, and checks
    /// that every claim was won.
    async fn flood_then_release(commits: &Arc<GroupCommit>, release: oneshot::Sender<()>) {
        let mut claims = Vec::new();
        for _ in 0..MAX_BATCH {
            let commits = commits.clone();
            claims.push(tokio::spawn(async move {
                commits.claim(claim(), &Approach::none()).await
            }));
        }
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let _ = release.send(());
        for claimed in claims {
            assert!(matches!(claimed.await, Ok(Ok(true))));
        }
    }

    #[tokio::test]
    async fn a_record_rides_in_the_next_batch_a_request_starts() {
        let (store, commits, release) = held_up().await;
        let recorded = spawn_record(&commits);
        tokio::task::yield_now().await;
        let claimed = tokio::spawn({
            let commits = commits.clone();
            async move { commits.claim(claim(), &Approach::none()).await }
        });
        tokio::task::yield_now().await;
        let _ = release.send(());
        assert!(matches!(claimed.await, Ok(Ok(true))));
        assert!(matches!(recorded.await, Ok(Ok(()))));
        assert_eq!(store.batches(), vec![(1, 0), (1, 1)]);
    }

    #[tokio::test]
    async fn a_record_alone_commits_once_it_waited_the_linger() {
        let store = Arc::new(Recorder::default());
        let commits = GroupCommit::start(store.clone(), 1, Some(GATHER), 0);
        let started = Instant::now();
        let recorded =
            tokio::time::timeout(Duration::from_secs(10), commits.record_attempt(record()));
        assert!(matches!(recorded.await, Ok(Ok(()))));
        assert!(
            started.elapsed() >= LINGER,
            "committed after {:?}",
            started.elapsed()
        );
        assert_eq!(store.batches(), vec![(0, 1)]);
    }

    #[tokio::test]
    async fn a_record_past_its_linger_goes_before_a_flood_of_requests_work() {
        let (store, commits, release) = held_up().await;
        let recorded = spawn_record(&commits);
        tokio::task::yield_now().await;
        tokio::time::sleep(LINGER).await;
        flood_then_release(&commits, release).await;
        assert!(matches!(recorded.await, Ok(Ok(()))));
        assert_eq!(store.batches(), vec![(1, 0), (MAX_BATCH - 1, 1), (1, 0)]);
    }

    #[tokio::test]
    async fn requests_work_fills_a_batch_before_held_records() {
        let (store, commits, release) = held_up().await;
        let started = Instant::now();
        let recorded = spawn_record(&commits);
        flood_then_release(&commits, release).await;
        assert!(matches!(recorded.await, Ok(Ok(()))));
        let waited = vec![(1, 0), (MAX_BATCH, 0), (0, 1)];
        // Only a machine stalled past the record's wait lets it go first.
        let overdue = vec![(1, 0), (MAX_BATCH - 1, 1), (1, 0)];
        let batches = store.batches();
        if started.elapsed() < LINGER {
            assert_eq!(batches, waited);
        } else {
            assert!(batches == waited || batches == overdue, "{batches:?}");
        }
    }

    /// Claims a key in the background for a request on its way (`approach`) after `after`.
    fn spawn_claim(
        commits: &Arc<GroupCommit>,
        after: Duration,
        approach: Approach,
    ) -> tokio::task::JoinHandle<Result<bool, StoreError>> {
        let commits = commits.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            commits.claim(claim(), &approach).await
        })
    }

    /// One committer over a recorder that lets every commit through.
    fn started() -> (Arc<Recorder>, Arc<GroupCommit>) {
        let store = Arc::new(Recorder::default());
        let commits = Arc::new(GroupCommit::start(store.clone(), 1, Some(GATHER), 0));
        (store, commits)
    }

    /// How long a claim queued now takes to commit.
    async fn time_to_commit(commits: &Arc<GroupCommit>) -> Duration {
        let queued = Instant::now();
        let claimed = spawn_claim(commits, Duration::ZERO, Approach::none()).await;
        assert!(matches!(claimed, Ok(Ok(true))));
        queued.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_committer_gathers_the_requests_on_their_way() {
        let (store, commits) = started();
        let on_its_way = commits.approach();
        let first = spawn_claim(&commits, Duration::ZERO, Approach::none());
        let second = spawn_claim(&commits, GATHER / 2, on_its_way);
        assert!(matches!(first.await, Ok(Ok(true))));
        assert!(matches!(second.await, Ok(Ok(true))));
        assert_eq!(store.batches(), vec![(2, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_request_waits_for_no_one() {
        let (_, commits) = started();
        assert_eq!(time_to_commit(&commits).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_does_not_gather_commits_what_is_queued_at_once() {
        let store = Arc::new(Recorder::default());
        let commits = Arc::new(GroupCommit::start(store.clone(), 1, None, 0));
        let _on_its_way = commits.approach();
        assert_eq!(time_to_commit(&commits).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_turns_away_ends_the_gathering() {
        let (store, commits) = started();
        let on_its_way = commits.approach();
        let started = Instant::now();
        let first = spawn_claim(&commits, Duration::ZERO, Approach::none());
        // The paused clock moves in whole milliseconds.
        tokio::time::sleep(GATHER / 2).await;
        drop(on_its_way);
        assert!(matches!(first.await, Ok(Ok(true))));
        assert_eq!(started.elapsed(), GATHER / 2);
        assert_eq!(store.batches(), vec![(1, 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_arrives_holds_a_batch_back_no_longer_than_the_gathering() {
        let (_, commits) = started();
        let _stuck = commits.approach();
        assert_eq!(time_to_commit(&commits).await, GATHER);
    }

    #[tokio::test(start_paused = true)]
    async fn work_queued_behind_a_commit_goes_without_gathering() {
        let (store, commits, release) = held_up().await;
        let _on_its_way = commits.approach();
        let queued = spawn_claim(&commits, Duration::ZERO, Approach::none());
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        let started = Instant::now();
        let _ = release.send(());
        assert!(matches!(queued.await, Ok(Ok(true))));
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert_eq!(store.batches(), vec![(1, 0), (1, 0)]);
    }
}
