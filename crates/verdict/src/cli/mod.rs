//! The `verdict` command line: one module per command group.

mod camara;
mod connector;
mod deliveries;
mod endpoint;
mod playbook;
mod subject;
mod tenant;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{Config, DatabaseArgs, DeliveryArgs, RetentionArgs, ServeArgs, ServeConfig};
use crate::retention::{Pruner, RetentionSettings, Sweep};
use crate::store;

use camara::run_camara;
pub use camara::{CamaraCommand, CamaraSubscriptionCommand};
pub use connector::ConnectorCommand;
use connector::run_connector;
pub use deliveries::DeliveriesCommand;
use deliveries::run_deliveries;
pub use endpoint::EndpointCommand;
use endpoint::run_endpoint;
pub use playbook::PlaybookCommand;
use playbook::run_playbook;
pub use subject::SubjectCommand;
use subject::run_subject;
use tenant::run_tenant;
pub use tenant::{KeyCommand, Purpose, TenantCommand};

/// What `--tenant` falls back to when it is not given: `tenant create --env` exports it.
const TENANT_ENV: &str = "VERDICT_TENANT_ID";

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
    /// Manage a tenant's connectors: its own systems that actions call.
    #[command(subcommand)]
    Connector(ConnectorCommand),
    /// Manage a tenant's callback endpoints: where its decisions are sent, and which.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Find a subject by phone or account, and unlock it, lift its deny or close its case.
    #[command(subcommand)]
    Subject(SubjectCommand),
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
        /// Send under this key, to retry by hand a send that gave up (the same file, the same
        /// key); default: a fresh UUIDv4.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Register CAMARA SIM Swap subscriptions (for notifications without a phone number).
    #[command(subcommand)]
    Camara(CamaraCommand),
    /// Receive callbacks: print each verified, deduplicated one once, as a JSON line.
    Listen {
        /// The tenant's webhook secret (`whsec_…`).
        #[arg(long, env = "VERDICT_WEBHOOK_SECRET", hide_env_values = true)]
        secret: String,
        /// Address to listen on.
        #[arg(
            long,
            env = "VERDICT_RECEIVER_LISTEN",
            default_value = "127.0.0.1:9000"
        )]
        listen: std::net::SocketAddr,
        /// Dedup store that survives restarts: `sqlite://PATH` or `postgres://…` (default: memory).
        #[arg(long)]
        db: Option<String>,
    },
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
        Command::Connector(cmd) => run_connector(&config, &file, cmd).await,
        Command::Endpoint(cmd) => run_endpoint(&config, &file, cmd).await,
        Command::Playbook(cmd) => run_playbook(&config, cmd).await,
        Command::Subject(cmd) => run_subject(&config, &file, cmd).await,
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
            idempotency_key,
        } => {
            crate::send::run(
                &file,
                &url,
                &api_key,
                signing_secret.as_deref(),
                idempotency_key.as_deref(),
            )
            .await
        }
        Command::Camara(CamaraCommand::Subscription(cmd)) => run_camara(&config, cmd).await,
        Command::Listen { secret, listen, db } => {
            crate::listen::run(&secret, listen, db.as_deref()).await
        }
    }
}

async fn run_prune(config: &Config, retention: RetentionSettings) -> anyhow::Result<()> {
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    let now = crate::clock::now_ms();
    let mut pruner = Pruner::new(Sweep::new(now));
    let (pruned, _) = pruner.run(&*store, retention, now, usize::MAX).await?;
    // A whole sweep: a server's pruner goes on from where it ended, not over what it deleted.
    store
        .save_sweep_position(&pruner.sweep().position())
        .await
        .context("saving where the sweep got to")?;
    println!("{}", serde_json::to_value(pruned)?);
    Ok(())
}

/// `value`, or the first line of stdin (without its line ending) when `value` is `-`: how an
/// identifier is passed without showing in the process list or the shell's history.
fn value_or_stdin(value: &str) -> anyhow::Result<String> {
    if value != "-" {
        return Ok(value.to_owned());
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading from stdin")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// The commands, flags and arguments that `--help` would show without a word about them.
    fn without_help(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        if cmd.get_about().is_none() {
            missing.push(path.to_owned());
        }
        for arg in cmd.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && !arg.is_hide_set() && arg.get_help().is_none() {
                missing.push(format!("{path} <{}>", arg.get_id()));
            }
        }
        for sub in cmd.get_subcommands() {
            without_help(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    #[test]
    fn every_command_flag_and_argument_has_help_text() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut missing = Vec::new();
        without_help(&cli, "verdict", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}
