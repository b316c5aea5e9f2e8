//! `verdict tenant …`: tenants, their secrets, callback endpoint and API keys.

use std::sync::Arc;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use uuid::Uuid;

use crate::config::{Config, DestinationArgs};
use crate::destination::CallbackUrl;
use crate::domain::{Feed, SuspendedCallbacks};
use crate::store::{Scope, SecretPurpose};
use crate::tenant::{self, TenantSpec};

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
    /// List every tenant: id, name, creation time and callback endpoint (never a secret).
    List {
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one tenant's settings (never a secret).
    Show {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Set the callback URL and re-enable the endpoint (after a 410 disabled it). The
    /// callbacks suspended while it was disabled are sent, each once with its stored bytes
    /// and webhook-id, unless `--leave-suspended`.
    SetCallback {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The new callback URL (omit to remove it; suspended callbacks then wait for one).
        #[arg(long)]
        url: Option<String>,
        /// Leave the suspended callbacks suspended: redeliver the ones wanted one by one
        /// (`deliveries redeliver`); retention prunes the rest.
        #[arg(long)]
        leave_suspended: bool,
        #[command(flatten)]
        destinations: DestinationArgs,
    },
    /// Replace a signing secret; the old one stays valid for the grace period.
    RotateSecret {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
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
    /// Set the tenant's Security Event Token transmitter (OpenID Shared Signals): SETs pushed
    /// to `POST /v1/sets` must carry its issuer and audience and verify with its keys.
    SetTransmitter {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The transmitter's `iss`.
        #[arg(long)]
        issuer: String,
        /// The `aud` its SETs must name: this receiver, as the transmitter knows it.
        #[arg(long)]
        audience: String,
        /// A JWKS document with the transmitter's public signing keys (stored).
        #[arg(
            long,
            required_unless_present = "jwks_url",
            conflicts_with = "jwks_url"
        )]
        jwks_file: Option<std::path::PathBuf>,
        /// Where the transmitter publishes its JWKS: fetched through the callbacks'
        /// destination guard, cached, and fetched again when a SET names an unknown `kid`.
        #[arg(long)]
        jwks_url: Option<String>,
        #[command(flatten)]
        destinations: DestinationArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Set the tenant's own rate limit, which wins over the server's setting.
    SetRateLimit {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Requests per second, with an equal burst; 0 removes the tenant's own limit.
        #[arg(long, required_unless_present = "clear", conflicts_with = "clear")]
        per_second: Option<u32>,
        /// Remove the tenant's own limit: the server's setting applies again.
        #[arg(long)]
        clear: bool,
    },
    /// Require the tenant's inbound signatures to cover the idempotency key
    /// (`Verdict-Signature: v2` or Standard Webhooks), so captured bytes cannot be replayed
    /// under a new key. Tenants created by this version require it; older ones take `v1`
    /// until this is run.
    RequireSignedKeys {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Take `v1` signatures again (for senders that cannot sign the key yet).
        #[arg(long)]
        off: bool,
    },
}

/// `verdict tenant key …`.
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Issue a key and print it (shown once).
    Create {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// ingest (send signals), read (the GET endpoints) or admin (everything).
        #[arg(long)]
        scope: Scope,
        /// Make an ingest key for one feed alone (camara or set): a carrier's sink
        /// credential or a SET transmitter's key, which may post there and nothing else. A
        /// tenant that requires signed signals takes only such keys on its feeds.
        #[arg(long)]
        feed: Option<Feed>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: every instance refuses it within 5 seconds.
    Revoke {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The key's id (from `create` or `list`).
        #[arg(long)]
        key_id: Uuid,
    },
    /// List the tenant's keys (never the keys themselves), oldest first.
    List {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
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

pub(super) async fn run_tenant(
    config: &Config,
    file: &crate::config::FileConfig,
    cmd: TenantCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    let keys = Arc::new(keys);
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
        TenantCommand::List { json } => {
            let tenants = tenant::list(&*store).await?;
            if json {
                println!("{}", serde_json::to_string(&tenants)?);
            } else {
                println!(
                    "{:<36}  {:<20}  {:<25}  callback",
                    "tenant_id", "name", "created"
                );
                for t in tenants {
                    println!(
                        "{:<36}  {:<20}  {:<25}  {}",
                        t.tenant_id,
                        t.name,
                        t.created_at,
                        callback_summary(&t)
                    );
                }
            }
        }
        TenantCommand::Show { tenant, json } => {
            let t = tenant::show(&*store, tenant).await?;
            if json {
                println!("{}", serde_json::to_string(&t)?);
            } else {
                let yes_no = |b: bool| if b { "yes" } else { "no" };
                println!("tenant_id                     {}", t.tenant_id);
                println!("name                          {}", t.name);
                println!("created                       {}", t.created_at);
                println!("callback                      {}", callback_summary(&t));
                println!(
                    "inbound signature required    {}",
                    yes_no(t.inbound_signature_required)
                );
                println!(
                    "signature covers the key      {}",
                    yes_no(t.inbound_signature_covers_key)
                );
                match t.rate_limit_per_second {
                    Some(n) => println!("rate limit                    {n}/s (the tenant's own)"),
                    None => println!("rate limit                    the server's setting"),
                }
            }
        }
        TenantCommand::SetCallback {
            tenant,
            url,
            leave_suspended,
            destinations,
        } => {
            let policy = destinations.resolve(file);
            let url = url
                .map(|url| CallbackUrl::parse(&url, policy))
                .transpose()?;
            let suspended = if leave_suspended {
                SuspendedCallbacks::Leave
            } else {
                SuspendedCallbacks::Resume
            };
            let n = tenant::set_callback(&*store, tenant, url.as_ref(), suspended).await?;
            println!("callback endpoint set and enabled");
            match (suspended, &url) {
                (SuspendedCallbacks::Resume, Some(_)) => {
                    println!("{n} suspended callback(s) due again, each sent once");
                }
                _ => println!("{n} callback(s) left suspended"),
            }
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
        TenantCommand::SetTransmitter {
            tenant,
            issuer,
            audience,
            jwks_file,
            jwks_url,
            destinations,
            json,
        } => {
            let keys = match (jwks_file, jwks_url) {
                (Some(path), _) => crate::feeds::TransmitterKeys::Document(
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))?,
                ),
                (None, Some(url)) => crate::feeds::TransmitterKeys::Url(url),
                (None, None) => anyhow::bail!("give --jwks-file or --jwks-url"),
            };
            let set = crate::feeds::set_transmitter(
                &*store,
                tenant,
                issuer,
                audience,
                keys,
                destinations.resolve(file),
            )
            .await?;
            if json {
                println!("{}", serde_json::to_string(&set)?);
            } else {
                match set.keys {
                    Some(n) => println!("SET transmitter set: {n} signing key(s) from the file"),
                    None => println!("SET transmitter set: keys fetched from the JWKS URL"),
                }
                println!("(running instances use it within 5 seconds)");
            }
        }
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
        TenantCommand::RequireSignedKeys { tenant, off } => {
            tenant::set_signature_covers_key(&*store, tenant, !off).await?;
            if off {
                println!("v1 signatures, which leave the idempotency key out, are taken again");
            } else {
                println!(
                    "inbound signatures must now cover the idempotency key (v2 or Standard Webhooks)"
                );
            }
        }
    }
    Ok(())
}

/// The callback endpoint in a few words: its URL, and whether a 410 disabled it.
fn callback_summary(t: &tenant::TenantView) -> String {
    match (&t.callback_url, t.callback_enabled) {
        (None, _) => "-".to_owned(),
        (Some(url), true) => url.clone(),
        (Some(url), false) => format!("{url} (disabled by a 410)"),
    }
}

async fn run_key(store: &dyn tenant::TenantPort, cmd: KeyCommand) -> anyhow::Result<()> {
    match cmd {
        KeyCommand::Create {
            tenant,
            scope,
            feed,
            json,
        } => {
            let issued = tenant::issue_key(store, tenant, scope, feed).await?;
            if json {
                println!("{}", serde_json::to_string(&issued)?);
            } else {
                println!("key_id   {}", issued.key_id);
                println!("api_key  {}", issued.api_key);
                println!("scope    {}", issued.scope);
                if let Some(feed) = issued.feed {
                    println!("feed     {feed} (this feed alone)");
                }
                println!("(the key is shown once; store it now)");
            }
        }
        KeyCommand::Revoke { tenant, key_id } => {
            tenant::revoke_key(store, tenant, key_id).await?;
            println!("key {key_id} revoked; every instance refuses it within 5 seconds");
        }
        KeyCommand::List { tenant, json } => {
            // Every key, a page at a time: at most the live quota plus the revoked ones.
            let mut keys: Vec<crate::http::KeyView> = Vec::new();
            let mut after = None;
            loop {
                let page = tenant::list_keys(store, tenant, after, tenant::MAX_KEYS_PAGE).await?;
                let full = page.len() as i64 == tenant::MAX_KEYS_PAGE;
                after = page.last().map(|k| k.id);
                keys.extend(page.into_iter().map(crate::http::KeyView::from));
                if !full {
                    break;
                }
            }
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
