//! The one read a decision needs, batched: the signals in flight share one statement, as their
//! writes share a commit. A reader takes every read queued the moment it is free. A reader
//! that found nothing queued, once the first read comes, also lets the runtime run the tasks
//! ready beside it (a few yields, no timer) and takes the reads they queue meanwhile: the
//! requests that came in with this one are parsed a moment after it, and without the yields
//! each would pay a statement of its own.

use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use super::approach::take;
use crate::store::{DecisionInputs, PlaybookStore, StoreError};

/// Most reads in one statement.
const MAX_BATCH: usize = 64;
/// Readers running at once: as many as the store's pipeline pool has connections for.
pub use crate::store::DECISION_READERS as READERS;
/// Reads waiting for a reader before requests wait to queue.
const QUEUE: usize = 4096;
/// How often an idle reader yields to the tasks ready beside it before it reads. On
/// PostgreSQL, 4 took a statement from under 2 reads to 3 at c=8, and from 4 to 20 at c=32;
/// 2 did nearly as well at c=8, 8 no better (docs/benchmarks.md, twenty-fifth session).
const GATHER_YIELDS: usize = 4;

type Subject = (Uuid, Vec<u8>);
type Answer = oneshot::Sender<Result<Option<DecisionInputs>, StoreError>>;

/// The queue in front of the readers.
pub struct DecisionReads {
    reads: mpsc::Sender<(Subject, Answer)>,
}

impl DecisionReads {
    /// Starts the readers.
    pub fn start(store: Arc<dyn PlaybookStore + Send + Sync>) -> Self {
        let (reads, queue) = mpsc::channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        for _ in 0..READERS {
            tokio::spawn(reader(store.clone(), queue.clone()));
        }
        Self { reads }
    }

    /// What a decision about `subject_hash` reads; `None` if the tenant is gone.
    pub async fn read(
        &self,
        tenant_id: Uuid,
        subject_hash: &[u8],
    ) -> Result<Option<DecisionInputs>, StoreError> {
        let (answer, answered) = oneshot::channel();
        let stopped = || StoreError::Unavailable(sqlx::Error::PoolClosed);
        self.reads
            .send(((tenant_id, subject_hash.to_vec()), answer))
            .await
            .map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

async fn reader(
    store: Arc<dyn PlaybookStore + Send + Sync>,
    queue: Arc<Mutex<mpsc::Receiver<(Subject, Answer)>>>,
) {
    loop {
        let reads = {
            let mut queue = queue.lock().await;
            // Reads already queued go at once; a reader that waits for the first gathers.
            let idle = queue.is_empty();
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut reads = vec![first];
            take(&mut queue, &mut reads, MAX_BATCH);
            if idle {
                // A lone read costs no more than the yields: with no other task ready, each
                // returns at once.
                for _ in 0..GATHER_YIELDS {
                    if reads.len() >= MAX_BATCH {
                        break;
                    }
                    tokio::task::yield_now().await;
                    take(&mut queue, &mut reads, MAX_BATCH);
                }
            }
            reads
        };
        metrics::histogram!("verdict_decision_read_subjects").record(reads.len() as f64);
        let subjects: Vec<Subject> = reads.iter().map(|(s, _)| s.clone()).collect();
        match store.decision_inputs(&subjects).await {
            Ok(found) => {
                for (subject, answer) in reads {
                    let _ = answer.send(Ok(found.get(&subject).cloned()));
                }
            }
            Err(err) => {
                let err = Arc::new(err);
                let mut failed = reads;
                // Reads that queued while this one waited for an unreachable database are
                // answered now rather than after a wait of their own.
                if err.is_unreachable()
                    && let Ok(mut queue) = queue.try_lock()
                {
                    while let Ok(read) = queue.try_recv() {
                        failed.push(read);
                    }
                }
                for (_, answer) in failed {
                    let _ = answer.send(Err(StoreError::Batch(err.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use std::collections::HashMap;
    use std::time::Duration;

    use crate::store::StoredPlaybook;

    /// How many subjects each statement read.
    #[derive(Default)]
    struct Recorder {
        statements: std::sync::Mutex<Vec<usize>>,
    }

    impl Recorder {
        fn statements(&self) -> Vec<usize> {
            self.statements
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default()
        }
    }

    #[async_trait]
    impl PlaybookStore for Recorder {
        async fn current_playbook(&self, _: Uuid) -> Result<Option<StoredPlaybook>, StoreError> {
            Ok(None)
        }
        async fn playbook_version(
            &self,
            _: Uuid,
            _: i64,
        ) -> Result<Option<StoredPlaybook>, StoreError> {
            Ok(None)
        }
        async fn put_playbook(&self, _: Uuid, _: &str, _: &str, _: i64) -> Result<i64, StoreError> {
            Ok(1)
        }
        async fn prune_playbooks(&self, _: i64, _: i64) -> Result<u64, StoreError> {
            Ok(0)
        }
        async fn decision_inputs(
            &self,
            subjects: &[Subject],
        ) -> Result<HashMap<Subject, DecisionInputs>, StoreError> {
            if let Ok(mut statements) = self.statements.lock() {
                statements.push(subjects.len());
            }
            Ok(subjects
                .iter()
                .map(|s| (s.clone(), DecisionInputs::default()))
                .collect())
        }
    }

    fn started() -> (Arc<Recorder>, Arc<DecisionReads>) {
        let store = Arc::new(Recorder::default());
        let reads = Arc::new(DecisionReads::start(store.clone()));
        (store, reads)
    }

    /// Reads a subject in the background once it yielded `yields` times and slept `after`:
    /// a request still being parsed, or one that comes later.
    fn spawn_read(
        reads: &Arc<DecisionReads>,
        yields: usize,
        after: Duration,
    ) -> tokio::task::JoinHandle<bool> {
        let reads = reads.clone();
        tokio::spawn(async move {
            for _ in 0..yields {
                tokio::task::yield_now().await;
            }
            tokio::time::sleep(after).await;
            matches!(reads.read(Uuid::nil(), b"s").await, Ok(Some(_)))
        })
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_reader_shares_its_statement_with_the_requests_running_beside_it() {
        let (store, reads) = started();
        let first = spawn_read(&reads, 0, Duration::ZERO);
        let parsing = spawn_read(&reads, GATHER_YIELDS - 1, Duration::ZERO);
        assert!(matches!(first.await, Ok(true)));
        assert!(matches!(parsing.await, Ok(true)));
        assert_eq!(store.statements(), vec![2]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_read_waits_for_no_time() {
        let (store, reads) = started();
        let queued = tokio::time::Instant::now();
        assert!(matches!(
            spawn_read(&reads, 0, Duration::ZERO).await,
            Ok(true)
        ));
        assert_eq!(queued.elapsed(), Duration::ZERO);
        assert_eq!(store.statements(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_comes_later_gets_a_statement_of_its_own() {
        let (store, reads) = started();
        let first = spawn_read(&reads, 0, Duration::ZERO);
        let later = spawn_read(&reads, 0, Duration::from_millis(1));
        assert!(matches!(first.await, Ok(true)));
        assert!(matches!(later.await, Ok(true)));
        assert_eq!(store.statements(), vec![1, 1]);
    }
}
