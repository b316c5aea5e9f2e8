//! The crate's vocabulary: values and names every layer shares. It imports nothing else from
//! the crate, so any module may import it without making a cycle.

pub mod feed;

pub use feed::{Feed, IGNORED_DECISION, RISC_CREDENTIAL_COMPROMISE, UNMAPPED_TYPE};
