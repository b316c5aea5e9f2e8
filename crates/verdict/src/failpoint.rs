//! Named failpoints between ingest phases, compiled in only with the `failpoints` feature.
//!
//! Configure with `FAILPOINTS="ingest::after_claim=return(abort)"` (the `fail` crate's syntax).
//! `return(abort)` aborts the process on the spot, as a crash would; `return` alone fails the
//! request as if the database had gone away; `sleep(ms)` and the other `fail` actions work too.

/// Marks a point where tests may inject a crash, a transient failure or a delay.
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        {
            fail::fail_point!($name, |arg| {
                if arg.as_deref() == Some("abort") {
                    std::process::abort();
                }
                Err(crate::failpoint::injected().into())
            });
        }
    };
}
pub(crate) use failpoint;

/// The error an injected failure returns: a transient database outage.
#[cfg(feature = "failpoints")]
pub(crate) fn injected() -> crate::store::StoreError {
    crate::store::StoreError::Unavailable(sqlx::Error::PoolTimedOut)
}
