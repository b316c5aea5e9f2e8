//! Sending identity-risk signals to verdict the way its `Idempotency-Key` contract needs.
//!
//! - [`client`]: [`Client::send_signal`] serialises a signal once, generates one UUIDv4
//!   `Idempotency-Key` for it, and posts the same bytes under that key on every attempt, each
//!   signed afresh (`Verdict-Timestamp`, `Verdict-Signature`: `v2` over
//!   `"{timestamp}.{key}.{body}"` and `v1` over `"{timestamp}.{body}"` for older tenants).
//! - [`retry`]: what each answer means. Network errors, 5xx and 429 back off exponentially with
//!   full jitter; 409 (the same signal still in flight) waits `Retry-After`; 422 is
//!   [`ClientError::KeyReusedWithDifferentBody`], a key-generation bug; any other 4xx is
//!   [`ClientError::Rejected`]; 2xx is a [`SignalOutcome`], replayed or not.
//! - [`error`](ClientError): the one error type.
//!
//! ```no_run
//! use verdict_client::Client;
//! use verdict_webhooks::Secret;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder("https://verdict.example", std::env::var("VERDICT_API_KEY")?)
//!     .signing_secret(Secret::parse(&std::env::var("VERDICT_SIGNING_SECRET")?)?)
//!     .build()?;
//! let outcome = client
//!     .send_signal(&serde_json::json!({
//!         "type": "sim_swap",
//!         "subject": {"phone": "+447700900123"},
//!         "observed_at": "2026-05-28T12:00:00Z",
//!         "attributes": {},
//!         "metadata": {"ticket": "T-1"}
//!     }))
//!     .await?;
//! println!("{} (replayed: {})", outcome.body, outcome.replayed);
//! # Ok(())
//! # }
//! ```

pub mod client;
mod error;
pub mod retry;

pub use client::{Client, ClientBuilder, SignalOutcome};
pub use error::ClientError;
pub use retry::Backoff;
