//! Group commit: the claims and effects of the signals in flight share one transaction and one
//! commit, so throughput is not bounded by one commit per signal.
//!
//! Requests queue their work; a committer takes whatever is queued (up to [`MAX_BATCH`]) the
//! moment it is free, with no timer: at low load a batch is one signal and waits for nothing.
//! Each request still gets its own outcome. A batch that fails for a reason that is not
//! transient is retried one signal at a time, so one bad signal never fails the others.

use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};

use crate::store::{
    Act, AttemptRecord, Batch, BatchResult, CallsDone, Claim, Committed, PipelineStore, StoreError,
};

/// Most signals' work in one commit: the store's limit.
pub use crate::store::MAX_BATCH;
/// Work waiting for a committer before requests wait to queue.
const QUEUE: usize = 4096;

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
}

impl GroupCommit {
    /// Starts `committers` committers (the store's number: one on SQLite).
    pub fn start(store: Arc<dyn PipelineStore>, committers: usize, alert_window_ms: i64) -> Self {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..committers.max(1) {
            tokio::spawn(committer(store.clone(), queue.clone(), alert_window_ms));
        }
        Self { jobs }
    }

    /// Inserts a new key's row; `false` if a row was already there.
    pub async fn claim(&self, claim: Claim) -> Result<bool, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Claim(Box::new(claim), reply)).await?;
        answer.await.map_err(|_| stopped())?
    }

    /// Applies a decided signal's effects and stores its event and response, with its key's
    /// claim if it carries one (`Err(LockLost)` if the claim or the held lock was lost).
    pub async fn act(&self, act: Act) -> Result<Committed, StoreError> {
        self.act_shared(act).await?.answer
    }

    /// [`Self::act`], with the number of signals its commit carried.
    pub async fn act_shared(
        &self,
        act: Act,
    ) -> Result<Shared<Result<Committed, StoreError>>, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Act(Box::new(act), reply)).await?;
        answer.await.map_err(|_| stopped())
    }

    /// Records an inline callback attempt and moves its delivery on.
    pub async fn record_attempt(&self, attempt: AttemptRecord) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::Attempt(Box::new(attempt), reply)).await?;
        answer.await.map_err(|_| stopped())?
    }

    /// Completes a dispatched signal once its calls answered.
    pub async fn complete_calls(&self, done: CallsDone) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.submit(Job::CallsDone(Box::new(done), reply)).await?;
        answer.await.map_err(|_| stopped())?
    }

    async fn submit(&self, job: Job) -> Result<(), StoreError> {
        self.jobs.send(job).await.map_err(|_| stopped())
    }
}

/// The committers are gone (shutting down): as transient as a lost connection.
fn stopped() -> StoreError {
    StoreError::Unavailable(sqlx::Error::PoolClosed)
}

async fn committer(
    store: Arc<dyn PipelineStore>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    window: i64,
) {
    loop {
        let jobs = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut jobs = vec![first];
            while jobs.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            jobs
        };
        metrics::histogram!("verdict_group_commit_signals").record(jobs.len() as f64);
        if let Some(unreachable) = run(&*store, jobs, window).await {
            // What queued while this batch waited for the database met the same outage: it is
            // answered now (503, retry) rather than after another wait of its own, so no request
            // waits out more than one connection timeout.
            if let Ok(mut queue) = queue.try_lock() {
                let mut waiting = Vec::new();
                while let Ok(job) = queue.try_recv() {
                    waiting.push(job);
                }
                fail(waiting, unreachable);
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
