//! verdict-receiver's integration tests, one binary: each module is one area, and `common` is the
//! helper module they share (envelopes, signed headers, fresh stores of every kind).

#[macro_use]
mod common;

mod axum_integration;
mod limits;
mod receiver;
mod store_behaviour;
