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
