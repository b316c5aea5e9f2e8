//! Wall-clock time as the store keeps it: unix milliseconds.

use time::OffsetDateTime;

use crate::domain::UnixMillis;

/// Now, by the wall clock.
pub fn now() -> UnixMillis {
    UnixMillis::now()
}

/// Milliseconds since the unix epoch, now.
pub fn now_ms() -> i64 {
    now().as_i64()
}

/// Milliseconds since the unix epoch of `t`.
pub fn to_ms(t: OffsetDateTime) -> i64 {
    UnixMillis::from(t).as_i64()
}

/// Unix milliseconds as RFC 3339 (empty past the year 9999).
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}
