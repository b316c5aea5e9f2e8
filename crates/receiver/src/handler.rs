//! The integrator's side: what a new event looks like, and the code that processes it.

use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use uuid::Uuid;
use verdict_webhooks::Envelope;

use crate::BoxError;

/// A new, verified event, handed to the [`Handler`] once.
#[derive(Clone)]
pub struct Event {
    /// The parsed callback body.
    pub envelope: Envelope,
    /// The body exactly as received and verified.
    pub body: Vec<u8>,
    /// The `webhook-id` header; absent only for unsigned deliveries without one.
    pub webhook_id: Option<String>,
    pub(crate) record_id: Uuid,
}

impl Event {
    /// The dedup store's id for this event's record.
    pub fn record_id(&self) -> Uuid {
        self.record_id
    }
}

// Bodies are never printed: they carry tenant metadata.
impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("webhook_id", &self.webhook_id)
            .field("record_id", &self.record_id)
            .field("event_id", &self.envelope.event_id)
            .field("event_type", &self.envelope.event_type)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// Processes each new event; an `async` closure `|event: Event| async move { … }` is one.
///
/// It runs once per event, with one exception: if the process dies (or the store fails) after
/// the handler's work but before its `Ok` is recorded, recovery runs it again. A handler must
/// therefore be idempotent for that crash window only; duplicates never reach it.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Processes one event; `Err` leaves it pending for the next recovery pass.
    async fn handle(&self, event: Event) -> Result<(), BoxError>;
}

#[async_trait]
impl<F, Fut, E> Handler for F
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError>,
{
    async fn handle(&self, event: Event) -> Result<(), BoxError> {
        (self)(event).await.map_err(Into::into)
    }
}
