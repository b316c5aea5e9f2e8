//! Wall-clock time as the store keeps it: unix milliseconds.

use time::OffsetDateTime;

/// Milliseconds since the unix epoch, now.
pub fn now_ms() -> i64 {
    to_ms(OffsetDateTime::now_utc())
}

/// Milliseconds since the unix epoch of `t`.
pub fn to_ms(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}
