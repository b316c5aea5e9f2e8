//! Wall-clock time as the store keeps it: unix milliseconds, by the database's clock.
//!
//! Locks, leases and key expiries are compared across instances, so they must come from one
//! clock: an instance whose own clock runs 30 s ahead would otherwise take over another's lock
//! 30 s early. Reading the database's clock in every statement would cost a round trip or
//! rewrite every one of them; instead the store measures how far this process's clock is from
//! the database's ([`set_offset`], sampled by the PostgreSQL store every few seconds) and every
//! reading here adds that offset. The error is half the sample's round trip, a millisecond or
//! so on a local network. SQLite's clock is the process's own, so its offset stays zero.

use std::sync::atomic::{AtomicI64, Ordering};

use time::OffsetDateTime;

use crate::domain::UnixMillis;

/// The database's clock minus this process's, in milliseconds.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Sets how far the database's clock is ahead of this process's (negative when behind).
pub fn set_offset(offset_ms: i64) {
    OFFSET_MS.store(offset_ms, Ordering::Relaxed);
}

/// How far the database's clock is ahead of this process's, as last measured.
pub fn offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

/// This process's own clock, without the offset: for measuring the offset itself.
pub fn local_ms() -> i64 {
    UnixMillis::from(OffsetDateTime::now_utc()).as_i64()
}

/// Now, by the database's clock.
pub fn now() -> UnixMillis {
    UnixMillis::new(now_ms())
}

/// Milliseconds since the unix epoch, now, by the database's clock.
pub fn now_ms() -> i64 {
    local_ms().saturating_add(offset_ms())
}

/// Now as a date-time, by the database's clock.
pub fn now_utc() -> OffsetDateTime {
    OffsetDateTime::now_utc()
        .checked_add(time::Duration::milliseconds(offset_ms()))
        .unwrap_or_else(OffsetDateTime::now_utc)
}

/// Milliseconds since the unix epoch of `t`.
pub fn to_ms(t: OffsetDateTime) -> i64 {
    UnixMillis::from(t).as_i64()
}

/// Unix milliseconds as RFC 3339 (empty past the year 9999).
pub fn rfc3339(ms: i64) -> String {
    UnixMillis::new(ms).rfc3339()
}
