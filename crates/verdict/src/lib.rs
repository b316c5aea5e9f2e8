//! verdict: exactly-once trust decisions for identity-risk signals.
//!
//! A request flows through the modules in this order:
//! HTTP ([`http`]) → validated [`signal::Signal`] and [`idempotency::IdempotencyKey`] →
//! [`tenant`] authentication → [`ingest`] (claim in the [`store`], decide with the
//! [`playbook`], record the recovery point, persist). [`feeds`] reads the standard feeds
//! (Security Event Tokens, CAMARA notifications) into the same pipeline; [`connectors`] manages
//! the tenant's own systems that actions call. [`secrets`] derives
//! every server key from one master key; [`config`] and [`cli`] wire it together for the
//! `verdict` binary, and [`telemetry`] exports its spans as OpenTelemetry traces when asked.
//!
//! Each layer imports only the ones below it: [`domain`] (which imports nothing from the crate)
//! ← [`store`] ← [`ingest`], [`delivery`], [`feeds`], [`playbook`], [`connectors`] ← [`app`] (what the HTTP
//! edges share: state, errors, connections, layers) ← the edges [`http`], [`console`] and
//! [`cli`], which import neither each other nor are imported below; [`server`] composes the API
//! and the console. [`problem`], [`signal`], [`secrets`], [`destination`] and [`telemetry`] import nothing
//! above them, so any layer may use them.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod connectors;
pub mod console;
pub mod delivery;
pub mod destination;
pub mod domain;
pub mod endpoints;
pub mod feeds;
pub mod http;
pub mod idempotency;
pub mod ingest;
pub mod listen;
pub mod playbook;
pub mod problem;
pub mod quota;
pub mod rate_limit;
pub mod retention;
pub mod secrets;
pub mod send;
pub mod server;
pub mod signal;
pub mod store;
pub mod subjects;
pub mod telemetry;
pub mod tenant;
