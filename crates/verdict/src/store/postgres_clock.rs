//! Keeps this process's clock on the database's ([`crate::clock`]): every instance then takes
//! lock, lease and expiry times from one clock, whatever its own machine's says.

use std::time::Duration;

use sqlx::PgPool;

/// How often the offset is measured again: a machine's clock drifts by well under a
/// millisecond in this time, but an operator or NTP may step it.
const RESAMPLE_EVERY: Duration = Duration::from_secs(5);

/// Samples per measurement; the one with the shortest round trip is kept, since its midpoint
/// is the closest to when the database read its clock.
const SAMPLES: usize = 3;

/// A sample whose round trip took longer than this is not trusted (a busy or distant database
/// would make the offset as uncertain as half of it).
const TRUSTED_ROUND_TRIP_MS: i64 = 200;

/// The database's clock, in unix milliseconds.
const DATABASE_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// One reading: the offset (database minus local) and the round trip it was read within.
async fn sample(pool: &PgPool) -> Result<(i64, i64), sqlx::Error> {
    let before = crate::clock::local_ms();
    let database: i64 = sqlx::query_scalar(DATABASE_NOW).fetch_one(pool).await?;
    let after = crate::clock::local_ms();
    let midpoint = before + (after - before) / 2;
    Ok((database - midpoint, after - before))
}

/// Measures the offset and applies it; the offset in force when no sample could be trusted.
pub(super) async fn measure(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let mut best: Option<(i64, i64)> = None;
    for _ in 0..SAMPLES {
        let (offset, round_trip) = sample(pool).await?;
        if best.is_none_or(|(_, shortest)| round_trip < shortest) {
            best = Some((offset, round_trip));
        }
    }
    match best {
        Some((offset, round_trip)) if round_trip <= TRUSTED_ROUND_TRIP_MS => {
            let previous = crate::clock::offset_ms();
            crate::clock::set_offset(offset);
            if (offset - previous).abs() > 1_000 {
                tracing::info!(
                    offset_ms = offset,
                    previous_ms = previous,
                    "this machine's clock differs from the database's; times follow the database's"
                );
            }
            Ok(offset)
        }
        _ => Ok(crate::clock::offset_ms()),
    }
}

/// Measures the offset every [`RESAMPLE_EVERY`] until aborted; a failed measurement (the
/// database unreachable) keeps the last offset.
pub(super) async fn follow(pool: PgPool) {
    loop {
        tokio::time::sleep(RESAMPLE_EVERY).await;
        if let Err(err) = measure(&pool).await {
            tracing::debug!(error = ?err, "could not read the database's clock; keeping the last offset");
        }
    }
}
