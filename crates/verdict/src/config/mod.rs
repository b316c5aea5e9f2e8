//! Configuration, layered: built-in defaults, then an optional TOML file, then `VERDICT_*`
//! environment variables and command-line flags (clap reads both; a flag wins).

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::app::connections::InboundLimits;
use crate::console::SessionLifetimes;
use crate::delivery::{DeliverySettings, MAX_DEADLINE};
use crate::destination::DestinationPolicy;
use crate::ingest::IngestSettings;
use crate::retention::RetentionSettings;
use crate::secrets::{MasterKey, SecretsError};
use crate::store;

mod admission;

pub use admission::{InboundArgs, QuotaArgs, QuotaSettings, RateLimitArgs, SetArgs, SetSettings};

/// The database used when none is configured: a file in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://verdict.db";
/// Where the API listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// How long an idempotency key is remembered by default (24 h).
pub const DEFAULT_KEY_TTL_SECS: u64 = 24 * 60 * 60;
/// How long a crashed holder's lock blocks a key by default.
pub const DEFAULT_LOCK_TIMEOUT_SECS: u64 = 60;
/// At most one customer alert per subject and signal type within this window by default.
pub const DEFAULT_ALERT_WINDOW_SECS: u64 = 24 * 60 * 60;
/// Time between worker delivery attempts by default (5 minutes).
pub const DEFAULT_RETRY_INTERVAL_SECS: u64 = 300;
/// The inline delivery attempt's deadline by default.
pub const DEFAULT_INLINE_DEADLINE_MS: u64 = 5000;
/// How often expired keys are pruned by default.
pub const DEFAULT_PRUNE_INTERVAL_SECS: u64 = 60;

/// How long an unused console session lasts by default (1 h).
pub const DEFAULT_CONSOLE_SESSION_IDLE_SECS: u64 = 60 * 60;
/// How long a console session lasts at most, however much it is used, by default (12 h).
pub const DEFAULT_CONSOLE_SESSION_MAX_SECS: u64 = 12 * 60 * 60;
/// The longest a console session may be configured to last (30 days).
pub const MAX_CONSOLE_SESSION_SECS: u64 = 30 * 24 * 60 * 60;

/// How long events (with their deliveries and attempts) are kept by default: 90 days.
pub const DEFAULT_EVENT_RETENTION_DAYS: u64 = 90;

/// Errors assembling configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("VERDICT_METRICS_TOKEN must be 32 to 256 visible ASCII characters")]
    MetricsToken,
    #[error("could not read the config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the config file {path} is invalid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("`{0}` is not a valid listen address (expected HOST:PORT)")]
    Listen(String),
    #[error(
        "VERDICT_MASTER_KEY (or master_key_file) must be set for {0}: every instance sharing \
         the database needs the same key"
    )]
    MasterKeyRequired(&'static str),
    #[error(
        "the delivery attempt deadline (VERDICT_INLINE_DEADLINE_MS, --inline-deadline-ms or \
         inline_deadline_ms) must be between 1 and {max_ms} ms, got {got_ms} ms: delivery leases \
         are sized from it"
    )]
    Deadline { got_ms: u64, max_ms: u128 },
    #[error(transparent)]
    Secrets(#[from] SecretsError),
    #[error(
        "{setting} must be between {min} and {max} (got {got}): it bounds what one client can \
         hold open"
    )]
    InboundLimit {
        setting: &'static str,
        got: u64,
        min: u64,
        max: u64,
    },
    #[error(
        "the request timeout ({request_secs} s) must be longer than the delivery attempt \
         deadline ({deadline_ms} ms), or every signal with a slow receiver would time out"
    )]
    RequestTimeoutTooShort {
        request_secs: u64,
        deadline_ms: u128,
    },
    #[error(
        "the event retention (VERDICT_EVENT_RETENTION_DAYS, --event-retention-days or \
         event_retention_days) must be at least 1 day and at least the idempotency key lifetime \
         ({key_ttl_secs} s), got {days} days"
    )]
    Retention { days: u64, key_ttl_secs: u64 },
    #[error(
        "the idempotency lock timeout must be at least 1 second (got {0} s): a shorter lock \
         lets a second request take over a key its holder is still working on"
    )]
    LockTimeoutTooShort(u64),
    #[error("{setting} must be between {min} and {max} seconds (got {got})")]
    SetSetting {
        setting: &'static str,
        got: u64,
        min: u64,
        max: u64,
    },
    #[error("{setting} must be between {min} and {max} seconds (got {got})")]
    ConsoleSession {
        setting: &'static str,
        got: u64,
        min: u64,
        max: u64,
    },
}

/// The optional config file's contents; every field may be omitted.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub database_url: Option<String>,
    pub key_ttl_secs: Option<u64>,
    pub lock_timeout_secs: Option<u64>,
    pub prune_interval_secs: Option<u64>,
    pub alert_window_secs: Option<u64>,
    pub retry_interval_secs: Option<u64>,
    pub inline_deadline_ms: Option<u64>,
    pub allow_private_destinations: Option<bool>,
    pub allow_link_local_destinations: Option<bool>,
    pub event_retention_days: Option<u64>,
    pub master_key_file: Option<PathBuf>,
    pub header_timeout_secs: Option<u64>,
    pub body_timeout_secs: Option<u64>,
    pub request_timeout_secs: Option<u64>,
    pub max_connections: Option<usize>,
    pub max_connections_per_client: Option<usize>,
    pub rate_limit_per_tenant: Option<u32>,
    pub set_max_age_secs: Option<u64>,
    pub set_max_ahead_secs: Option<u64>,
    pub set_jwks_refresh_secs: Option<u64>,
    pub metrics_token: Option<String>,
    pub max_events_per_tenant_per_day: Option<u64>,
    pub quota_sync_secs: Option<u64>,
    pub console_session_idle_secs: Option<u64>,
    pub console_session_max_secs: Option<u64>,
}

impl FileConfig {
    /// Reads the file, or the empty config when there is none.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })
    }
}

/// Settings every command that touches the database shares.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// Database URL: `sqlite://PATH` (default `sqlite://verdict.db`) or `postgres://…`, which
    /// may name several hosts (`postgres://h1:5432,h2:5432/db`): connections go to the one that
    /// takes writes, and follow a failover.
    #[arg(long = "database", env = "VERDICT_DATABASE_URL", global = true)]
    pub database_url: Option<String>,
    /// A TOML config file with any of the settings.
    #[arg(long, env = "VERDICT_CONFIG", global = true)]
    pub config: Option<PathBuf>,
}

/// Settings of callback delivery, shared by `serve` and `worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct DeliveryArgs {
    /// Seconds between worker attempts of a failing delivery.
    #[arg(long, env = "VERDICT_RETRY_INTERVAL_SECS")]
    pub retry_interval_secs: Option<u64>,
    /// Deadline of each delivery attempt, in milliseconds (1 to 30000).
    #[arg(long, env = "VERDICT_INLINE_DEADLINE_MS")]
    pub inline_deadline_ms: Option<u64>,
    #[command(flatten)]
    pub destinations: DestinationArgs,
}

/// Which non-public callback destinations are allowed; read by `serve`, `worker`, `deliveries
/// redeliver` (at send time) and `tenant create|set-callback` (when a URL is set).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct DestinationArgs {
    /// Allow callbacks to loopback and private addresses and `localhost` (tests, private
    /// networks). Link-local and cloud metadata addresses stay refused.
    #[arg(long, env = "VERDICT_ALLOW_PRIVATE_DESTINATIONS", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allow_private_destinations: Option<bool>,
    /// Allow callbacks to link-local addresses, cloud metadata endpoints among them
    /// (169.254.0.0/16, fe80::/10). Almost never what you want.
    #[arg(long, env = "VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allow_link_local_destinations: Option<bool>,
}

impl DestinationArgs {
    /// Flags and environment first, then the file; everything off by default.
    pub fn resolve(&self, file: &FileConfig) -> DestinationPolicy {
        DestinationPolicy {
            allow_private: self
                .allow_private_destinations
                .or(file.allow_private_destinations)
                .unwrap_or(false),
            allow_link_local: self
                .allow_link_local_destinations
                .or(file.allow_link_local_destinations)
                .unwrap_or(false),
        }
    }
}

impl DeliveryArgs {
    /// Flags and environment first, then the file, then defaults. The deadline must be at
    /// least 1 ms and at most [`MAX_DEADLINE`].
    pub fn resolve(&self, file: &FileConfig) -> Result<DeliverySettings, ConfigError> {
        let deadline_ms = self
            .inline_deadline_ms
            .or(file.inline_deadline_ms)
            .unwrap_or(DEFAULT_INLINE_DEADLINE_MS);
        let deadline = Duration::from_millis(deadline_ms);
        if deadline.is_zero() || deadline > MAX_DEADLINE {
            return Err(ConfigError::Deadline {
                got_ms: deadline_ms,
                max_ms: MAX_DEADLINE.as_millis(),
            });
        }
        Ok(DeliverySettings {
            deadline,
            retry_interval: Duration::from_secs(
                self.retry_interval_secs
                    .or(file.retry_interval_secs)
                    .unwrap_or(DEFAULT_RETRY_INTERVAL_SECS)
                    .max(1),
            ),
            destinations: self.destinations.resolve(file),
        })
    }
}

/// How long events are kept; read by `serve` (its pruner) and `prune`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RetentionArgs {
    /// Days an event, its deliveries and their attempts are kept before they are pruned.
    #[arg(long, env = "VERDICT_EVENT_RETENTION_DAYS")]
    pub event_retention_days: Option<u64>,
}

impl RetentionArgs {
    /// Flags and environment first, then the file, then [`DEFAULT_EVENT_RETENTION_DAYS`]. At
    /// least one day, and at least `key_ttl_ms`: an event must outlive every key that can
    /// still name it.
    pub fn resolve(
        &self,
        file: &FileConfig,
        key_ttl_ms: i64,
    ) -> Result<RetentionSettings, ConfigError> {
        let days = self
            .event_retention_days
            .or(file.event_retention_days)
            .unwrap_or(DEFAULT_EVENT_RETENTION_DAYS);
        let events = Duration::from_secs(days.saturating_mul(24 * 60 * 60));
        let key_ttl = Duration::from_millis(key_ttl_ms.max(0).unsigned_abs());
        if days == 0 || events < key_ttl {
            return Err(ConfigError::Retention {
                days,
                key_ttl_secs: key_ttl.as_secs(),
            });
        }
        Ok(RetentionSettings { events })
    }
}

/// How long console sessions last; read by `serve`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ConsoleArgs {
    /// Seconds a console session lasts without use (1 to 2592000; default 3600).
    #[arg(long, env = "VERDICT_CONSOLE_SESSION_IDLE_SECS")]
    pub console_session_idle_secs: Option<u64>,
    /// Seconds a console session lasts at most, however much it is used (1 to 2592000;
    /// default 43200).
    #[arg(long, env = "VERDICT_CONSOLE_SESSION_MAX_SECS")]
    pub console_session_max_secs: Option<u64>,
}

impl ConsoleArgs {
    /// Flags and environment first, then the file, then defaults; each within 1 s and
    /// [`MAX_CONSOLE_SESSION_SECS`].
    pub fn resolve(&self, file: &FileConfig) -> Result<SessionLifetimes, ConfigError> {
        let bounded = |setting, got: Option<u64>, default: u64| match got {
            Some(got) if !(1..=MAX_CONSOLE_SESSION_SECS).contains(&got) => {
                Err(ConfigError::ConsoleSession {
                    setting,
                    got,
                    min: 1,
                    max: MAX_CONSOLE_SESSION_SECS,
                })
            }
            got => Ok(Duration::from_secs(got.unwrap_or(default))),
        };
        Ok(SessionLifetimes {
            idle: bounded(
                "VERDICT_CONSOLE_SESSION_IDLE_SECS",
                self.console_session_idle_secs
                    .or(file.console_session_idle_secs),
                DEFAULT_CONSOLE_SESSION_IDLE_SECS,
            )?,
            absolute: bounded(
                "VERDICT_CONSOLE_SESSION_MAX_SECS",
                self.console_session_max_secs
                    .or(file.console_session_max_secs),
                DEFAULT_CONSOLE_SESSION_MAX_SECS,
            )?,
        })
    }
}

/// Settings of `verdict serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Do not run the delivery worker inside this process (run `verdict worker` instead).
    #[arg(long, env = "VERDICT_NO_WORKER", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub no_worker: bool,
    #[command(flatten)]
    pub delivery: DeliveryArgs,
    /// Address to listen on.
    #[arg(long, env = "VERDICT_LISTEN")]
    pub listen: Option<String>,
    /// How long an idempotency key is remembered, in seconds.
    #[arg(long, env = "VERDICT_KEY_TTL_SECS")]
    pub key_ttl_secs: Option<u64>,
    /// How long a crashed holder's lock blocks its key, in seconds.
    #[arg(long, env = "VERDICT_LOCK_TIMEOUT_SECS")]
    pub lock_timeout_secs: Option<u64>,
    /// How often expired keys are pruned, in seconds.
    #[arg(long, env = "VERDICT_PRUNE_INTERVAL_SECS")]
    pub prune_interval_secs: Option<u64>,
    /// At most one customer alert per subject and signal type within this many seconds.
    #[arg(long, env = "VERDICT_ALERT_WINDOW_SECS")]
    pub alert_window_secs: Option<u64>,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub inbound: InboundArgs,
    #[command(flatten)]
    pub rate_limit: RateLimitArgs,
    #[command(flatten)]
    pub sets: SetArgs,
    #[command(flatten)]
    pub quota: QuotaArgs,
    /// A bearer token `GET /metrics` requires (32 to 256 visible ASCII characters); unset:
    /// `/metrics` is open to anyone who reaches the port. Set it in the environment or the
    /// config file, where a process list does not show it.
    #[arg(long, env = "VERDICT_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    #[command(flatten)]
    pub console: ConsoleArgs,
}

/// The lifetimes of an idempotency key and its lock, for a command that claims keys outside
/// `verdict serve` (the way back): the same settings, variables and defaults as `serve`'s.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KeyLifetimeArgs {
    /// How long an idempotency key is remembered, in seconds.
    #[arg(long, env = "VERDICT_KEY_TTL_SECS")]
    pub key_ttl_secs: Option<u64>,
    /// How long a crashed holder's lock blocks its key, in seconds.
    #[arg(long, env = "VERDICT_LOCK_TIMEOUT_SECS")]
    pub lock_timeout_secs: Option<u64>,
}

impl KeyLifetimeArgs {
    /// (key lifetime, lock timeout) in ms: flags and environment, then the file, then defaults.
    pub fn resolve(&self, file: &FileConfig) -> Result<(i64, i64), ConfigError> {
        let ms = |s: u64| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let lock = self
            .lock_timeout_secs
            .or(file.lock_timeout_secs)
            .unwrap_or(DEFAULT_LOCK_TIMEOUT_SECS);
        if lock < 1 {
            return Err(ConfigError::LockTimeoutTooShort(lock));
        }
        let ttl = self
            .key_ttl_secs
            .or(file.key_ttl_secs)
            .unwrap_or(DEFAULT_KEY_TTL_SECS);
        Ok((ms(ttl), ms(lock)))
    }
}

/// The resolved settings for database access and secrets.
#[derive(Debug, Clone)]
pub struct Config {
    pub database_url: String,
    pub master_key_file: Option<PathBuf>,
}

impl Config {
    /// Resolves the database URL and master key location.
    pub fn resolve(db: &DatabaseArgs) -> Result<(Self, FileConfig), ConfigError> {
        let file = FileConfig::load(db.config.as_deref())?;
        let database_url = db
            .database_url
            .clone()
            .or_else(|| file.database_url.clone())
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.into());
        let config = Self {
            database_url,
            master_key_file: file.master_key_file.clone(),
        };
        Ok((config, file))
    }

    /// The master key: `VERDICT_MASTER_KEY`, else the configured file, else (SQLite only) a
    /// file beside the database, created on first use.
    pub fn master_key(&self) -> Result<MasterKey, ConfigError> {
        if let Ok(text) = std::env::var("VERDICT_MASTER_KEY") {
            return Ok(MasterKey::from_base64(&text)?);
        }
        if let Some(path) = &self.master_key_file {
            return Ok(MasterKey::load_or_create(path)?);
        }
        match store::sqlite_path(&self.database_url) {
            Some(db) => Ok(MasterKey::load_or_create(&master_key_beside(&db))?),
            None => Err(ConfigError::MasterKeyRequired("a shared database")),
        }
    }
}

/// The default master key file for a SQLite database file.
pub fn master_key_beside(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".master-key");
    db.with_file_name(name)
}

/// Resolved settings of `verdict serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub ingest: IngestSettings,
    pub delivery: DeliverySettings,
    pub run_worker: bool,
    pub prune_interval_secs: u64,
    pub inbound: InboundLimits,
    /// Requests per second per tenant without its own limit; `None`: unlimited.
    pub rate_limit_per_tenant: Option<NonZeroU32>,
    pub retention: RetentionSettings,
    pub sets: SetSettings,
    /// How long console sessions last.
    pub console_sessions: SessionLifetimes,
    /// The bearer token `GET /metrics` requires, if any.
    pub metrics_token: Option<MetricsToken>,
    /// Each tenant's daily quota of events.
    pub quota: QuotaSettings,
}

/// The token `GET /metrics` requires; its `Debug` leaves it out.
#[derive(Clone)]
pub struct MetricsToken(String);

impl MetricsToken {
    /// Checks a configured token's form.
    pub fn parse(token: &str) -> Result<Self, ConfigError> {
        let ok = (32..=256).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_graphic());
        ok.then(|| Self(token.to_owned()))
            .ok_or(ConfigError::MetricsToken)
    }

    /// Whether `presented` is this token, in constant time.
    pub fn matches(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        bool::from(self.0.as_bytes().ct_eq(presented.as_bytes()))
    }
}

impl std::fmt::Debug for MetricsToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsToken(<redacted>)")
    }
}

impl ServeConfig {
    /// Flags and environment first, then the file, then defaults.
    pub fn resolve(args: &ServeArgs, file: &FileConfig) -> Result<Self, ConfigError> {
        let listen = args
            .listen
            .clone()
            .or_else(|| file.listen.clone())
            .unwrap_or_else(|| DEFAULT_LISTEN.into());
        let secs =
            |flag: Option<u64>, file: Option<u64>, default: u64| flag.or(file).unwrap_or(default);
        let ms = |s: u64| i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let lock_timeout_secs = secs(
            args.lock_timeout_secs,
            file.lock_timeout_secs,
            DEFAULT_LOCK_TIMEOUT_SECS,
        );
        if lock_timeout_secs < 1 {
            return Err(ConfigError::LockTimeoutTooShort(lock_timeout_secs));
        }
        let delivery = args.delivery.resolve(file)?;
        let key_ttl_ms = ms(secs(
            args.key_ttl_secs,
            file.key_ttl_secs,
            DEFAULT_KEY_TTL_SECS,
        ));
        Ok(Self {
            retention: args.retention.resolve(file, key_ttl_ms)?,
            listen: listen.parse().map_err(|_| ConfigError::Listen(listen))?,
            inbound: args.inbound.resolve(file, &delivery)?,
            delivery,
            run_worker: !args.no_worker,
            ingest: IngestSettings {
                key_ttl_ms,
                lock_timeout_ms: ms(lock_timeout_secs),
                alert_window_ms: ms(secs(
                    args.alert_window_secs,
                    file.alert_window_secs,
                    DEFAULT_ALERT_WINDOW_SECS,
                )),
            },
            prune_interval_secs: secs(
                args.prune_interval_secs,
                file.prune_interval_secs,
                DEFAULT_PRUNE_INTERVAL_SECS,
            )
            .max(1),
            rate_limit_per_tenant: args.rate_limit.resolve(file),
            sets: args.sets.resolve(file)?,
            quota: args.quota.resolve(file)?,
            metrics_token: args
                .metrics_token
                .clone()
                .or_else(|| file.metrics_token.clone())
                .filter(|token| !token.is_empty())
                .map(|token| MetricsToken::parse(&token))
                .transpose()?,
            console_sessions: args.console.resolve(file)?,
        })
    }
}

#[cfg(test)]
mod tests;
