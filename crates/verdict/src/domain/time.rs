//! Wall-clock instants as the store keeps them: unix milliseconds.

use std::fmt;

use time::OffsetDateTime;

/// Milliseconds since the unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(i64);

impl UnixMillis {
    /// The instant `ms` milliseconds after the epoch.
    pub const fn new(ms: i64) -> Self {
        Self(ms)
    }

    /// The milliseconds, as stored.
    pub const fn as_i64(self) -> i64 {
        self.0
    }

    /// As RFC 3339 (empty past the year 9999).
    pub fn rfc3339(self) -> String {
        OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0) * 1_000_000)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default()
    }
}

impl From<OffsetDateTime> for UnixMillis {
    /// Saturates past the year 292 million.
    fn from(t: OffsetDateTime) -> Self {
        Self(i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX))
    }
}

impl fmt::Display for UnixMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
