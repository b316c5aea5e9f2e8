//! What the API admits, as configured: inbound connections and requests, per-tenant rate
//! limits, and the time window of pushed Security Event Tokens.

use std::num::NonZeroU32;
use std::time::Duration;

use super::{ConfigError, FileConfig};
use crate::app::connections::InboundLimits;
use crate::delivery::DeliverySettings;
use crate::feeds::set::SetWindow;

/// How Security Event Tokens pushed to `POST /v1/sets` are judged.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SetArgs {
    /// Seconds a SET's `iat` may lie in the past (1 to 86400; default 300).
    #[arg(long, env = "VERDICT_SET_MAX_AGE_SECS")]
    pub set_max_age_secs: Option<u64>,
    /// Seconds a SET's `iat` may lie ahead of the server's clock (0 to 3600; default 60).
    #[arg(long, env = "VERDICT_SET_MAX_AHEAD_SECS")]
    pub set_max_ahead_secs: Option<u64>,
    /// Least seconds between two fetches of a transmitter's JWKS URL that SETs with unknown
    /// `kid`s prompt (1 to 86400; default 60).
    #[arg(long, env = "VERDICT_SET_JWKS_REFRESH_SECS")]
    pub set_jwks_refresh_secs: Option<u64>,
}

/// Resolved SET settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetSettings {
    pub window: SetWindow,
    /// Least time between unknown-`kid` refreshes of one JWKS URL.
    pub jwks_refresh: Duration,
}

impl SetArgs {
    /// Flags and environment first, then the file, then defaults; each within its bounds.
    pub fn resolve(&self, file: &FileConfig) -> Result<SetSettings, ConfigError> {
        let bounded = |setting, got: Option<u64>, default: u64, min: u64, max: u64| match got {
            Some(got) if !(min..=max).contains(&got) => Err(ConfigError::SetSetting {
                setting,
                got,
                min,
                max,
            }),
            got => Ok(Duration::from_secs(got.unwrap_or(default))),
        };
        let defaults = SetWindow::default();
        Ok(SetSettings {
            window: SetWindow {
                max_age: bounded(
                    "VERDICT_SET_MAX_AGE_SECS",
                    self.set_max_age_secs.or(file.set_max_age_secs),
                    defaults.max_age.as_secs(),
                    1,
                    86_400,
                )?,
                max_ahead: bounded(
                    "VERDICT_SET_MAX_AHEAD_SECS",
                    self.set_max_ahead_secs.or(file.set_max_ahead_secs),
                    defaults.max_ahead.as_secs(),
                    0,
                    3600,
                )?,
            },
            jwks_refresh: bounded(
                "VERDICT_SET_JWKS_REFRESH_SECS",
                self.set_jwks_refresh_secs.or(file.set_jwks_refresh_secs),
                60,
                1,
                86_400,
            )?,
        })
    }
}

/// Bounds on inbound connections and requests.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct InboundArgs {
    /// Seconds a client has to send a request's headers (1 to 300; default 30).
    #[arg(long, env = "VERDICT_HEADER_TIMEOUT_SECS")]
    pub header_timeout_secs: Option<u64>,
    /// Seconds a client has to send a request's body (1 to 300; default 30).
    #[arg(long, env = "VERDICT_BODY_TIMEOUT_SECS")]
    pub body_timeout_secs: Option<u64>,
    /// Seconds after which a request is answered 503 (1 to 600; default 60).
    #[arg(long, env = "VERDICT_REQUEST_TIMEOUT_SECS")]
    pub request_timeout_secs: Option<u64>,
    /// Connections held at once (1 to 100000; default 1024).
    #[arg(long, env = "VERDICT_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Connections held at once from one client address (1 to 100000, at most
    /// `VERDICT_MAX_CONNECTIONS`; default 256). Behind a load balancer every connection comes
    /// from its address: raise it to `VERDICT_MAX_CONNECTIONS` there.
    #[arg(long, env = "VERDICT_MAX_CONNECTIONS_PER_CLIENT")]
    pub max_connections_per_client: Option<usize>,
}

impl InboundArgs {
    /// Flags and environment first, then the file, then defaults; each within its bounds,
    /// and the request timeout longer than the inline delivery attempt.
    pub fn resolve(
        &self,
        file: &FileConfig,
        delivery: &DeliverySettings,
    ) -> Result<InboundLimits, ConfigError> {
        let defaults = InboundLimits::default();
        let bounded = |setting, got: Option<u64>, default: u64, max: u64| match got {
            Some(got) if !(1..=max).contains(&got) => Err(ConfigError::InboundLimit {
                setting,
                got,
                min: 1,
                max,
            }),
            got => Ok(got.unwrap_or(default)),
        };
        let header = bounded(
            "VERDICT_HEADER_TIMEOUT_SECS",
            self.header_timeout_secs.or(file.header_timeout_secs),
            defaults.header_timeout.as_secs(),
            300,
        )?;
        let body = bounded(
            "VERDICT_BODY_TIMEOUT_SECS",
            self.body_timeout_secs.or(file.body_timeout_secs),
            defaults.body_timeout.as_secs(),
            300,
        )?;
        let request = bounded(
            "VERDICT_REQUEST_TIMEOUT_SECS",
            self.request_timeout_secs.or(file.request_timeout_secs),
            defaults.request_timeout.as_secs(),
            600,
        )?;
        let connections = bounded(
            "VERDICT_MAX_CONNECTIONS",
            self.max_connections
                .or(file.max_connections)
                .map(|n| n as u64),
            defaults.max_connections as u64,
            100_000,
        )?;
        let per_client = bounded(
            "VERDICT_MAX_CONNECTIONS_PER_CLIENT",
            self.max_connections_per_client
                .or(file.max_connections_per_client)
                .map(|n| n as u64),
            defaults.max_connections_per_client as u64,
            100_000,
        )?
        .min(connections);
        let request_timeout = Duration::from_secs(request);
        if request_timeout <= delivery.deadline {
            return Err(ConfigError::RequestTimeoutTooShort {
                request_secs: request,
                deadline_ms: delivery.deadline.as_millis(),
            });
        }
        Ok(InboundLimits {
            header_timeout: Duration::from_secs(header),
            body_timeout: Duration::from_secs(body),
            request_timeout,
            max_connections: usize::try_from(connections).unwrap_or(usize::MAX),
            max_connections_per_client: usize::try_from(per_client).unwrap_or(usize::MAX),
        })
    }
}

/// Events a tenant may store a day (UTC) when nothing is set: a hundred times what a large
/// fraud team's systems send, well short of what fills a disk.
pub const DEFAULT_MAX_EVENTS_PER_TENANT_PER_DAY: u64 = 10_000_000;

/// The daily quota of events per tenant, and how often instances share their counts.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct QuotaArgs {
    /// Events a tenant may store a day, UTC (default 10000000); 0: unlimited.
    #[arg(long, env = "VERDICT_MAX_EVENTS_PER_TENANT_PER_DAY")]
    pub max_events_per_tenant_per_day: Option<u64>,
    /// How often, in seconds, each instance adds its counts and reads the sums (1 to 60;
    /// default 5): a tenant can pass its quota by what it stores in that long.
    #[arg(long, env = "VERDICT_QUOTA_SYNC_SECS")]
    pub quota_sync_secs: Option<u64>,
}

/// [`QuotaArgs`], resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSettings {
    /// `None`: unlimited.
    pub max_events_per_day: Option<std::num::NonZeroU64>,
    pub sync: Duration,
}

impl QuotaArgs {
    /// Flags and environment first, then the file, then defaults.
    pub fn resolve(&self, file: &FileConfig) -> Result<QuotaSettings, ConfigError> {
        let sync = self.quota_sync_secs.or(file.quota_sync_secs).unwrap_or(5);
        if !(1..=60).contains(&sync) {
            return Err(ConfigError::InboundLimit {
                setting: "VERDICT_QUOTA_SYNC_SECS",
                got: sync,
                min: 1,
                max: 60,
            });
        }
        Ok(QuotaSettings {
            max_events_per_day: std::num::NonZeroU64::new(
                self.max_events_per_tenant_per_day
                    .or(file.max_events_per_tenant_per_day)
                    .unwrap_or(DEFAULT_MAX_EVENTS_PER_TENANT_PER_DAY),
            ),
            sync: Duration::from_secs(sync),
        })
    }
}

/// Requests per second (and burst) per tenant and instance when nothing is set: well above what
/// one real tenant sends (its fraud system's signals), well below what would let one tenant
/// take an instance from the others.
pub const DEFAULT_RATE_LIMIT_PER_TENANT: u32 = 1_000;

/// The rate limit of tenants that have none of their own (`verdict tenant set-rate-limit`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RateLimitArgs {
    /// Requests per second, with an equal burst, per tenant and instance (default 1000); 0:
    /// unlimited.
    #[arg(long, env = "VERDICT_RATE_LIMIT_PER_TENANT")]
    pub rate_limit_per_tenant: Option<u32>,
}

impl RateLimitArgs {
    /// The flag or environment, else the file, else [`DEFAULT_RATE_LIMIT_PER_TENANT`]; `None`
    /// (unlimited) when set to 0.
    pub fn resolve(&self, file: &FileConfig) -> Option<NonZeroU32> {
        NonZeroU32::new(
            self.rate_limit_per_tenant
                .or(file.rate_limit_per_tenant)
                .unwrap_or(DEFAULT_RATE_LIMIT_PER_TENANT),
        )
    }
}
