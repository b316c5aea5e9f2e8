//! The `verdict` command line.

use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use uuid::Uuid;

use crate::config::{
    Config, DatabaseArgs, DeliveryArgs, DestinationArgs, RetentionArgs, ServeArgs, ServeConfig,
};
use crate::delivery::destination::CallbackUrl;
use crate::delivery::{REDELIVER_INTERVAL, Redelivered};
use crate::playbook::{self, Format};
use crate::retention::RetentionSettings;
use crate::store::{self, Scope, SecretPurpose};
use crate::tenant::{self, TenantSpec};

/// verdict: exactly-once trust decisions for identity-risk signals.
#[derive(Debug, Parser)]
#[command(name = "verdict", version)]
pub struct Cli {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP API.
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate,
    /// Manage tenants.
    #[command(subcommand)]
    Tenant(TenantCommand),
    /// Read or replace a tenant's playbook.
    #[command(subcommand)]
    Playbook(PlaybookCommand),
    /// Run the delivery worker (retries of callbacks).
    Worker {
        #[command(flatten)]
        delivery: DeliveryArgs,
        /// Run one round (every delivery due now, once) and exit.
        #[arg(long)]
        once: bool,
    },
    /// Inspect and redeliver callbacks.
    #[command(subcommand)]
    Deliveries(DeliveriesCommand),
    /// Delete expired idempotency keys and everything past retention now, and print what was
    /// deleted as JSON (`serve` does the same every prune interval).
    Prune {
        #[command(flatten)]
        retention: RetentionArgs,
    },
    /// Send one signal (JSON from FILE or stdin) and print the decision.
    Send {
        /// The signal; `-` reads standard input.
        #[arg(default_value = "-")]
        file: std::path::PathBuf,
        /// The verdict API's base URL.
        #[arg(long, env = "VERDICT_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The tenant's API key.
        #[arg(long, env = "VERDICT_API_KEY", hide_env_values = true)]
        api_key: String,
        /// The tenant's inbound signing secret (omit if the tenant accepts unsigned signals).
        #[arg(long, env = "VERDICT_SIGNING_SECRET", hide_env_values = true)]
        signing_secret: Option<String>,
    },
    /// Receive callbacks: print each verified, deduplicated one once, as a JSON line.
    Listen {
        /// The tenant's webhook secret (`whsec_…`).
        #[arg(long, env = "VERDICT_WEBHOOK_SECRET", hide_env_values = true)]
        secret: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: std::net::SocketAddr,
        /// Dedup store that survives restarts: `sqlite://PATH` or `postgres://…` (default: memory).
        #[arg(long)]
        db: Option<String>,
    },
}

/// `verdict deliveries …`.
#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List a tenant's deliveries, newest first, as JSON lines.
    List {
        #[arg(long)]
        tenant: Uuid,
        /// pending, succeeded, failed or dead.
        #[arg(long)]
        status: Option<crate::delivery::DeliveryStatus>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one delivery and its attempts as JSON.
    Show {
        #[arg(long)]
        tenant: Uuid,
        id: Uuid,
    },
    /// Attempt a delivery again now, with the same webhook-id, and a fresh retry budget.
    Redeliver {
        #[arg(long)]
        tenant: Uuid,
        id: Uuid,
        #[command(flatten)]
        delivery: DeliveryArgs,
    },
}

/// `verdict playbook …`.
#[derive(Debug, Subcommand)]
pub enum PlaybookCommand {
    /// Validate FILE (TOML, or JSON by `.json` extension) and make it the tenant's playbook.
    Set {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// The playbook document; `-` reads standard input.
        file: std::path::PathBuf,
    },
    /// Print the tenant's playbook in force and its version.
    Show {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
    },
    /// Run FILE against the tenant's stored events and print what would change; writes nothing.
    Simulate {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// The newest this many events (1 to 10000).
        #[arg(long, default_value_t = playbook::simulation::DEFAULT_SIMULATED_EVENTS)]
        limit: usize,
        /// Print the whole comparison as JSON instead of the summary table.
        #[arg(long)]
        json: bool,
        /// The candidate playbook; `-` reads standard input.
        file: std::path::PathBuf,
    },
}

/// `verdict tenant …`.
#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Create a tenant and print its credentials (shown once).
    Create {
        /// A name for people to recognise the tenant by.
        #[arg(long)]
        name: String,
        /// Accept unsigned signals from this tenant (a deliberate, recorded choice).
        #[arg(long)]
        no_inbound_signature: bool,
        /// Where signed callbacks are sent.
        #[arg(long)]
        callback_url: Option<String>,
        #[command(flatten)]
        destinations: DestinationArgs,
        /// Print one JSON object.
        #[arg(long, conflicts_with = "env")]
        json: bool,
        /// Print `export VERDICT_…=…` lines for a shell to `eval`.
        #[arg(long)]
        env: bool,
    },
    /// Set the callback URL and re-enable the endpoint (after a 410 disabled it).
    SetCallback {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// The new callback URL (omit to remove it).
        #[arg(long)]
        url: Option<String>,
        #[command(flatten)]
        destinations: DestinationArgs,
    },
    /// Replace a signing secret; the old one stays valid for the grace period.
    RotateSecret {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// Which secret to rotate.
        #[arg(long, value_enum, default_value_t = Purpose::Inbound)]
        purpose: Purpose,
        /// How long the old secret stays valid, in seconds.
        #[arg(long, default_value_t = 24 * 60 * 60)]
        grace_secs: u64,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Issue, list and revoke the tenant's API keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Set the tenant's own rate limit, which wins over the server's setting.
    SetRateLimit {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// Requests per second, with an equal burst; 0 removes the tenant's own limit.
        #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
        per_second: Option<u32>,
        /// Remove the tenant's own limit: the server's setting applies again.
        #[arg(long)]
        clear: bool,
    },
}

/// `verdict tenant key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Issue a key and print it (shown once).
    Create {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// ingest (send signals), read (the GET endpoints) or admin (everything).
        #[arg(long)]
        scope: Scope,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: every instance refuses it within 5 seconds.
    Revoke {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// The key's id (from `create` or `list`).
        #[arg(long)]
        key_id: Uuid,
    },
    /// List the tenant's keys (never the keys themselves), oldest first.
    List {
        /// The tenant's id.
        #[arg(long)]
        tenant: Uuid,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
}

/// Which of a tenant's secrets.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Purpose {
    /// Verifies inbound `Verdict-Signature`.
    Inbound,
    /// Signs outbound callbacks.
    Webhook,
}

impl From<Purpose> for SecretPurpose {
    fn from(p: Purpose) -> Self {
        match p {
            Purpose::Inbound => SecretPurpose::Inbound,
            Purpose::Webhook => SecretPurpose::Webhook,
        }
    }
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let (config, file) = Config::resolve(&cli.db)?;
    match cli.command {
        Command::Serve(args) => {
            let serve = ServeConfig::resolve(&args, &file)?;
            crate::server::serve(&config, serve).await
        }
        Command::Migrate => {
            store::connect(&config.database_url)
                .await
                .context("connecting to the database and migrating")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Tenant(cmd) => run_tenant(&config, &file, cmd).await,
        Command::Playbook(cmd) => run_playbook(&config, cmd).await,
        Command::Worker { delivery, once } => {
            crate::server::work(&config, delivery.resolve(&file)?, once).await
        }
        Command::Deliveries(cmd) => run_deliveries(&config, &file, cmd).await,
        Command::Prune { retention } => run_prune(&config, retention.resolve(&file, 0)?).await,
        Command::Send {
            file,
            url,
            api_key,
            signing_secret,
        } => crate::send::run(&file, &url, &api_key, signing_secret.as_deref()).await,
        Command::Listen { secret, listen, db } => {
            crate::listen::run(&secret, listen, db.as_deref()).await
        }
    }
}

async fn run_deliveries(
    config: &Config,
    file: &crate::config::FileConfig,
    cmd: DeliveriesCommand,
) -> anyhow::Result<()> {
    let keys = Arc::new(config.master_key()?.keyring());
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    let show = |d: crate::store::DeliveryRecord| {
        serde_json::json!({
            "id": d.id, "event_id": d.event_id, "webhook_id": d.webhook_id,
            "status": d.status.as_str(), "attempts": d.attempts, "last_error": d.last_error,
        })
    };
    match cmd {
        DeliveriesCommand::List {
            tenant,
            status,
            limit,
        } => {
            for d in store
                .deliveries(tenant, status, None, limit.clamp(1, 10_000))
                .await?
            {
                println!("{}", show(d));
            }
        }
        DeliveriesCommand::Show { tenant, id } => {
            let d = store
                .delivery(tenant, id)
                .await?
                .context("no such delivery")?;
            let attempts: Vec<_> = store
                .delivery_attempts(id)
                .await?
                .into_iter()
                .map(|a| {
                    serde_json::json!({
                        "trigger": a.trigger, "status_code": a.status_code,
                        "latency_ms": a.latency_ms, "error": a.error,
                    })
                })
                .collect();
            let mut out = show(d);
            out["attempts"] = attempts.into();
            println!("{out}");
        }
        DeliveriesCommand::Redeliver {
            tenant,
            id,
            delivery,
        } => {
            let deliverer =
                crate::delivery::Deliverer::new(store.clone(), keys, delivery.resolve(file)?)?;
            match deliverer.redeliver(tenant, id).await? {
                Redelivered::Attempted(verdict) => {
                    let d = store
                        .delivery(tenant, id)
                        .await?
                        .context("no such delivery")?;
                    println!("{}", show(d));
                    tracing::info!(?verdict, "redelivered");
                }
                Redelivered::TooSoon(wait) => anyhow::bail!(
                    "delivery {id} was not redelivered: it was redelivered less than {} s ago \
                     (at most one redelivery per delivery every {} s); retry in {} s",
                    REDELIVER_INTERVAL.as_secs(),
                    REDELIVER_INTERVAL.as_secs(),
                    wait.as_millis().div_ceil(1000)
                ),
                Redelivered::Unavailable => anyhow::bail!(
                    "delivery {id} was not redelivered: it does not exist, an attempt is in \
                     progress, or the endpoint is disabled"
                ),
            }
        }
    }
    Ok(())
}

async fn run_prune(config: &Config, retention: RetentionSettings) -> anyhow::Result<()> {
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    let now = crate::clock::now_ms();
    let keys = store.prune_expired_keys(now).await?;
    let pruned = crate::retention::prune(&*store, retention, now, usize::MAX).await?;
    let mut out = serde_json::to_value(pruned)?;
    out["idempotency_keys"] = keys.into();
    println!("{out}");
    Ok(())
}

async fn run_playbook(config: &Config, cmd: PlaybookCommand) -> anyhow::Result<()> {
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    match cmd {
        PlaybookCommand::Set { tenant, file } => {
            store.tenant(tenant).await?.context("no such tenant")?;
            let (source, format) = read_playbook(&file)?;
            let version = playbook::upload(&*store, tenant, &source, format).await?;
            println!("playbook version {version} is now in force");
        }
        PlaybookCommand::Simulate {
            tenant,
            limit,
            json,
            file,
        } => {
            store.tenant(tenant).await?.context("no such tenant")?;
            let (source, format) = read_playbook(&file)?;
            let candidate = playbook::Playbook::parse(&source, format)?;
            let window = playbook::simulation::Window { since: None, limit };
            let result =
                playbook::simulation::simulate(&*store, tenant, &candidate, window).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&result)?);
            } else {
                print!("{}", result.summary_table());
            }
        }
        PlaybookCommand::Show { tenant } => {
            let stored = playbook::current_source(&*store, tenant).await?;
            println!("# version {} ({})", stored.version, stored.format);
            print!("{}", stored.source);
        }
    }
    Ok(())
}

/// A playbook file (or standard input for `-`) and its format, by extension or content.
fn read_playbook(file: &std::path::Path) -> anyhow::Result<(String, Format)> {
    let source = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let format = match file.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        Some("toml") => Format::Toml,
        _ => Format::sniff(&source),
    };
    Ok((source, format))
}

async fn run_tenant(
    config: &Config,
    file: &crate::config::FileConfig,
    cmd: TenantCommand,
) -> anyhow::Result<()> {
    let keys = Arc::new(config.master_key()?.keyring());
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    match cmd {
        TenantCommand::Create {
            name,
            no_inbound_signature,
            callback_url,
            destinations,
            json,
            env,
        } => {
            // The destination guard judges the URL before anything is created.
            let policy = destinations.resolve(file);
            let callback_url = callback_url
                .map(|url| CallbackUrl::parse(&url, policy))
                .transpose()?;
            let created = tenant::create(
                &*store,
                &keys,
                TenantSpec {
                    name,
                    inbound_signature_required: !no_inbound_signature,
                    callback_url,
                },
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string(&created)?);
            } else if env {
                println!("export VERDICT_TENANT_ID='{}'", created.tenant_id);
                println!("export VERDICT_API_KEY='{}'", created.api_key);
                println!("export VERDICT_SIGNING_SECRET='{}'", created.signing_secret);
                println!("export VERDICT_WEBHOOK_SECRET='{}'", created.webhook_secret);
            } else {
                println!("tenant_id       {}", created.tenant_id);
                println!("api_key         {}", created.api_key);
                println!("signing_secret  {}", created.signing_secret);
                println!("webhook_secret  {}", created.webhook_secret);
                println!("(secrets are shown once; store them now)");
            }
        }
        TenantCommand::SetCallback {
            tenant,
            url,
            destinations,
        } => {
            let policy = destinations.resolve(file);
            let url = url
                .map(|url| CallbackUrl::parse(&url, policy))
                .transpose()?;
            tenant::set_callback(&*store, tenant, url.as_ref()).await?;
            println!("callback endpoint set and enabled");
        }
        TenantCommand::RotateSecret {
            tenant,
            purpose,
            grace_secs,
            json,
        } => {
            let grace_ms = i64::try_from(grace_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
            let secret =
                tenant::rotate_secret(&*store, &keys, tenant, purpose.into(), grace_ms).await?;
            if json {
                let out = serde_json::json!({
                    "tenant_id": tenant,
                    "purpose": SecretPurpose::from(purpose).as_str(),
                    "secret": secret.to_whsec(),
                    "previous_valid_for_secs": grace_secs,
                });
                println!("{out}");
            } else {
                println!("{}", secret.to_whsec());
            }
        }
        TenantCommand::Key(cmd) => run_key(&*store, cmd).await?,
        TenantCommand::SetRateLimit {
            tenant,
            per_second,
            clear: _,
        } => {
            // `--clear` and `--per-second 0` both leave `None`.
            let per_second = per_second.and_then(std::num::NonZeroU32::new);
            tenant::set_rate_limit(&*store, tenant, per_second).await?;
            match per_second {
                Some(n) => println!("rate limit set to {n} requests per second (burst {n})"),
                None => println!("the tenant's own rate limit is removed; the server's applies"),
            }
        }
    }
    Ok(())
}

async fn run_key(store: &dyn store::Store, cmd: KeyCommand) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Create {
            tenant,
            scope,
            json,
        } => {
            let issued = tenant::issue_key(store, tenant, scope).await?;
            if json {
                println!("{}", serde_json::to_string(&issued)?);
            } else {
                println!("key_id   {}", issued.key_id);
                println!("api_key  {}", issued.api_key);
                println!("scope    {}", issued.scope);
                println!("(the key is shown once; store it now)");
            }
        }
        KeyCommand::Revoke { tenant, key_id } => {
            tenant::revoke_key(store, tenant, key_id).await?;
            println!("key {key_id} revoked; every instance refuses it within 5 seconds");
        }
        KeyCommand::List { tenant, json } => {
            let keys: Vec<crate::http::KeyView> = tenant::list_keys(store, tenant)
                .await?
                .into_iter()
                .map(Into::into)
                .collect();
            if json {
                println!("{}", serde_json::to_string(&keys)?);
            } else {
                println!(
                    "{:<36}  {:<6}  {:<25}  {:<25}  revoked",
                    "key_id", "scope", "created", "last used"
                );
                for k in keys {
                    let or_dash = |t: Option<String>| t.unwrap_or_else(|| "-".into());
                    println!(
                        "{:<36}  {:<6}  {:<25}  {:<25}  {}",
                        k.key_id,
                        k.scope.as_str(),
                        k.created_at,
                        or_dash(k.last_used_at),
                        or_dash(k.revoked_at)
                    );
                }
            }
        }
    }
    Ok(())
}
