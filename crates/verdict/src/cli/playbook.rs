//! `verdict playbook …`: set, show and simulate a tenant's playbook.

use anyhow::Context;
use clap::Subcommand;
use uuid::Uuid;

use crate::config::Config;
use crate::playbook::{self, Format};
use crate::store;

/// `verdict playbook …`.
#[derive(Debug, Subcommand)]
pub enum PlaybookCommand {
    /// Validate FILE (TOML, or JSON by `.json` extension) and make it the tenant's playbook.
    Set {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The playbook document; `-` reads standard input.
        file: std::path::PathBuf,
    },
    /// Print the tenant's playbook in force and its version.
    Show {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
    },
    /// Run FILE against the tenant's stored events and print what would change; writes nothing.
    Simulate {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
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

pub(super) async fn run_playbook(config: &Config, cmd: PlaybookCommand) -> anyhow::Result<()> {
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
