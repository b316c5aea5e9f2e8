//! verdict's integration tests, one binary: each module is one area, and `common` is the harness
//! they share (a fresh database per test on either backend, the real `verdict` binary on a real
//! socket). One binary compiles and links the harness once instead of once per area.
//!
//! Every test drives the server as a child process, so nothing process-global (environment,
//! failpoints) is shared between tests here. The fault suite (`crash_storm`, `faults`) runs with
//! `scripts/faults`, which filters this binary by those modules.

// clippy.toml's allow-unwrap-in-tests covers #[test] functions only; the helpers and the
// per-backend test bodies here are plain functions, and a panic is how a test fails.
#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

mod actions;
mod ambiguous_calls;
mod cli;
mod connector_calls;
mod connectors;
mod console;
mod console_sessions;
mod console_subjects;
mod crash_storm;
mod custom_actions;
mod delivery;
mod delivery_faults;
mod delivery_hardening;
mod delivery_queue;
mod destination_guard;
mod embedded_default;
mod end_to_end;
mod endpoint_delivery;
mod endpoints;
mod faults;
mod faults_clock;
mod faults_disk;
mod faults_ha;
mod faults_instances;
mod faults_network;
mod feeds_camara;
mod feeds_set;
mod hostile_input;
mod hostile_receivers;
mod idempotency;
mod inbound_limits;
mod listen;
mod openapi_fuzz;
mod openapi_webhooks;
mod operations;
mod pipeline;
mod playbooks;
mod privacy;
mod quotas;
mod rate_limits;
mod readme;
mod rejection;
mod retention;
mod robustness;
mod scopes;
mod signed_keys;
mod simulation;
mod traces;
mod way_back;
