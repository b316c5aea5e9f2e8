//! [Standard Webhooks](https://www.standardwebhooks.com/) signing and verification.
//!
//! A message is signed as `v1,<base64 HMAC-SHA256(key, "{id}.{timestamp}.{body}")>`,
//! where the key is the decoded bytes of a `whsec_<base64>` [`Secret`]. The sender
//! attaches the result with [`signed_headers`]; a receiver checks it with a
//! [`Verifier`], which also enforces timestamp freshness to bound replays.
//!
//! [`Secret::sign_content`] and [`signature_matches`] expose the same HMAC over
//! arbitrary content, for schemes that sign a different message.
//!
//! The crate has no server dependencies: only `http` for [`http::HeaderMap`].
//!
//! ```
//! use verdict_webhooks::{Headers, Secret, Verifier, signed_headers};
//!
//! let secret = Secret::generate();
//! let body = br#"{"decision":"allow"}"#;
//! let [(_, id), (_, timestamp), (_, signature)] =
//!     signed_headers(&[secret.clone()], "msg_1", 1_700_000_000, body);
//!
//! let headers = Headers { id: &id, timestamp: &timestamp, signature: &signature };
//! let verifier = Verifier::new(vec![secret]);
//! assert_eq!(verifier.verify(&headers, body, 1_700_000_010), Ok(1_700_000_000));
//! ```

mod envelope;
mod error;
mod secret;
mod signature;
mod verify;

pub use envelope::Envelope;
pub use error::{Error, VerifyError};
pub use secret::Secret;
pub use signature::{signature_matches, signature_matches_as, signed_headers};
pub use verify::{DEFAULT_TOLERANCE_SECS, Headers, MAX_SIGNATURES, Verifier};

/// Header carrying the unique message id.
pub const HEADER_ID: &str = "webhook-id";
/// Header carrying the unix timestamp (seconds) the message was signed at.
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying one or more space-separated `v1,<base64>` signatures.
pub const HEADER_SIGNATURE: &str = "webhook-signature";
