//! The one read a decision needs, batched: the signals in flight share one statement, as their
//! writes share a commit. A reader takes every read queued the moment it is free (no timer).

use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use uuid::Uuid;

use crate::store::{DecisionInputs, PlaybookStore, StoreError};

/// Most reads in one statement.
const MAX_BATCH: usize = 64;
/// Readers running at once: as many as the store's pipeline pool has connections for.
pub use crate::store::DECISION_READERS as READERS;
/// Reads waiting for a reader before requests wait to queue.
const QUEUE: usize = 4096;

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
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut reads = vec![first];
            while reads.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(read) => reads.push(read),
                    Err(_) => break,
                }
            }
            reads
        };
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
