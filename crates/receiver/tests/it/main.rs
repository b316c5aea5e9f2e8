//! verdict-receiver's integration tests, one binary: each module is one area, and `common` is the
//! helper module they share (envelopes, signed headers, fresh stores of every kind).

// clippy.toml's allow-unwrap-in-tests covers #[test] functions only; the helpers and the
// per-backend test bodies here are plain functions, and a panic is how a test fails.
#![allow(clippy::unwrap_used)]

#[macro_use]
mod common;

mod axum_integration;
mod limits;
mod receiver;
mod store_behaviour;
