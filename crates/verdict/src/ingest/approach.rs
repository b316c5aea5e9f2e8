//! Requests on their way to a batcher's queue (the group commit's), counted so that a batcher
//! that found its queue empty can wait a moment for them and send one statement where it would
//! have sent several; and taking what a queue holds, which the decision reads share.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// How many requests are on their way to one queue, and a wake-up each time one arrives or
/// turns away.
#[derive(Default)]
struct Approaching {
    count: AtomicUsize,
    changed: Notify,
}

impl Approaching {
    /// Counts a request on its way, until the [`Approach`] arrives or is dropped.
    fn approach(self: &Arc<Self>) -> Approach {
        self.count.fetch_add(1, Ordering::AcqRel);
        Approach {
            approaching: Some(self.clone()),
            arrived: AtomicBool::new(false),
        }
    }

    /// Adds to `taken` what the requests on their way put on `queue`, as they do, until none
    /// is on its way, `max` are taken, `gather` has passed, or the queue is closed.
    async fn gather<T>(
        &self,
        queue: &mut mpsc::Receiver<T>,
        taken: &mut Vec<T>,
        max: usize,
        gather: Duration,
    ) {
        let until = Instant::now() + gather;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Read before taking: a request counts as arrived only once its item is queued,
            // so a zero read here leaves nothing behind.
            let on_the_way = self.count.load(Ordering::Acquire);
            take(queue, taken, max);
            if on_the_way == 0 || taken.len() >= max {
                return;
            }
            tokio::select! {
                biased;
                item = queue.recv() => match item {
                    Some(item) => taken.push(item),
                    None => return,
                },
                () = &mut changed => {}
                () = tokio::time::sleep_until(until) => return,
            }
        }
    }
}

/// Adds what `queue` holds now to `taken`, up to `max` in all.
pub(super) fn take<T>(queue: &mut mpsc::Receiver<T>, taken: &mut Vec<T>, max: usize) {
    while taken.len() < max {
        match queue.try_recv() {
            Ok(item) => taken.push(item),
            Err(_) => break,
        }
    }
}

/// A request on its way to a queue: counted from its start until it queues its item there or
/// ends another way (dropped). Counted nowhere when its batcher does not gather.
pub struct Approach {
    approaching: Option<Arc<Approaching>>,
    arrived: AtomicBool,
}

impl Approach {
    /// A request no batcher waits for.
    pub(super) fn none() -> Self {
        Self {
            approaching: None,
            arrived: AtomicBool::new(true),
        }
    }

    /// No longer on its way; once, however often called.
    pub(super) fn arrive(&self) {
        let Some(approaching) = &self.approaching else {
            return;
        };
        if !self.arrived.swap(true, Ordering::AcqRel) {
            approaching.count.fetch_sub(1, Ordering::AcqRel);
            approaching.changed.notify_waiters();
        }
    }
}

impl Drop for Approach {
    fn drop(&mut self) {
        self.arrive();
    }
}

/// The count of one queue's requests on their way, for a batcher that gathers, and for how
/// long it does.
#[derive(Clone)]
pub(super) struct Gathering {
    approaching: Arc<Approaching>,
    time: Duration,
}

impl Gathering {
    /// A batcher that gathers for `time`; `None` for one that does not gather.
    pub(super) fn new(time: Option<Duration>) -> Option<Self> {
        time.map(|time| Self {
            approaching: Arc::default(),
            time,
        })
    }

    /// Counts a request on its way to this batcher's queue.
    pub(super) fn approach(&self) -> Approach {
        self.approaching.approach()
    }

    /// [`Approaching::gather`] for this batcher's time.
    pub(super) async fn gather<T>(
        &self,
        queue: &mut mpsc::Receiver<T>,
        taken: &mut Vec<T>,
        max: usize,
    ) {
        self.approaching.gather(queue, taken, max, self.time).await;
    }
}
