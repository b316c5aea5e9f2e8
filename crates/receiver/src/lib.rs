//! Receiving verdict's callbacks correctly by default: the receiver's checklist as code.
//!
//! A delivery goes through the modules in order:
//!
//! 1. [`receiver`]: [`Receiver::receive`] refuses a body over the size limit (1 MiB by default)
//!    and a `webhook-signature` with more than [`verdict_webhooks::MAX_SIGNATURES`] entries,
//!    verifies the Standard Webhooks signature over the exact raw bytes (refusing stale
//!    timestamps as replays, never as duplicates), then parses the body as a
//!    [`verdict_webhooks::Envelope`], then records it.
//! 2. [`store`]: a [`DedupStore`] records the `webhook-id`, a digest of the envelope tuple
//!    (tenant, event type, subject hash, timestamp) and the raw body in one transaction. A
//!    delivery whose id *or* tuple is already held is a [`Received::Duplicate`]: answer 2xx and
//!    discard it. SQLite and PostgreSQL stores outlive restarts; the memory store does not.
//! 3. [`handler`]: after the 2xx, [`Receiver::process`] runs the integrator's [`Handler`] and
//!    marks the record processed when it returns `Ok`. [`Receiver::recover`] hands events that a
//!    crash left unprocessed to the handler again, so each event is handled once; a handler need
//!    only be idempotent for the window between its work and the record of its `Ok`.
//! 4. [`axum`](mod@crate::axum): all of the above as one endpoint, answering 204, 401, 400, 413
//!    or 503.
//!
//! Processed records are kept for the [horizon](DEFAULT_HORIZON) (72 h), longer than verdict's
//! retry schedule and the window in which an operator redelivers by hand, then pruned.

pub mod axum;
mod error;
pub mod handler;
pub mod receiver;
pub mod store;

pub use error::{BoxError, ReceiveError};
pub use handler::{Event, Handler};
pub use receiver::{
    DEFAULT_HANDLER_LEASE, DEFAULT_HORIZON, DEFAULT_MAX_BODY_BYTES, DEFAULT_PRUNE_INTERVAL,
    DEFAULT_RECOVERY_INTERVAL, Received, Receiver, ReceiverBuilder, Recovered,
};
pub use store::{
    DedupStore, MemoryDedupStore, PostgresDedupStore, Record, RecordOutcome, SqliteDedupStore,
    TupleDigest,
};
