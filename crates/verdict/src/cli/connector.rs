//! `verdict connector …`: a tenant's connectors, as `PUT/GET/DELETE /v1/connectors/{name}`
//! manages them.

use anyhow::Context;
use clap::Subcommand;
use uuid::Uuid;

use crate::config::{Config, DestinationArgs, FileConfig};
use crate::connectors::{self, ConnectorSpec};
use crate::domain::{ConnectorKind, ConnectorName, Guarantee, MatchAttribute};

/// `verdict connector …`.
#[derive(Debug, Subcommand)]
pub enum ConnectorCommand {
    /// Create or replace a connector. A new HTTP connector's signing secret is printed once.
    Set {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Its name, as the playbook binds actions to it.
        #[arg(long)]
        name: ConnectorName,
        /// `http` (a signed POST of each action request) or `scim` (RFC 7644).
        #[arg(long)]
        kind: ConnectorKind,
        /// The HTTP endpoint, or the SCIM service provider's base URL.
        #[arg(long)]
        url: String,
        /// SCIM: a file holding the bearer token (kept from before when omitted).
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        /// SCIM: the attribute the subject's account is matched against.
        #[arg(long = "match")]
        match_attribute: Option<MatchAttribute>,
        /// `exactly_once` (retried until it answers) or `at_most_once` (never retried after
        /// an ambiguous outcome).
        #[arg(long, default_value_t = Guarantee::ExactlyOnce)]
        guarantee: Guarantee,
        /// HTTP: make a new signing secret for a connector that exists.
        #[arg(long)]
        rotate_secret: bool,
        #[command(flatten)]
        destinations: DestinationArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List the tenant's connectors (never their credentials).
    List {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one connector (never its credential).
    Show {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The connector's name.
        #[arg(long)]
        name: ConnectorName,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete a connector.
    Delete {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The connector's name.
        #[arg(long)]
        name: ConnectorName,
    },
}

pub(super) async fn run_connector(
    config: &Config,
    file: &FileConfig,
    cmd: ConnectorCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    match cmd {
        ConnectorCommand::Set {
            tenant,
            name,
            kind,
            url,
            token_file,
            match_attribute,
            guarantee,
            rotate_secret,
            destinations,
            json,
        } => {
            let token = token_file
                .map(|path| {
                    std::fs::read_to_string(&path)
                        .with_context(|| format!("reading {}", path.display()))
                        .map(|t| t.trim().to_owned())
                })
                .transpose()?;
            let spec = ConnectorSpec {
                kind,
                url,
                token,
                match_attribute,
                guarantee,
                rotate_secret,
            };
            let policy = destinations.resolve(file);
            let set = connectors::set(&*store, &keys, tenant, name, spec, policy).await?;
            if json {
                println!("{}", serde_json::to_string(&set)?);
            } else {
                let verb = if set.created { "created" } else { "replaced" };
                println!("connector {} {verb}", set.connector.name);
                if let Some(secret) = &set.secret {
                    println!("secret  {secret}");
                    println!("(the secret is shown once; its requests are signed with it)");
                }
            }
        }
        ConnectorCommand::List { tenant, json } => {
            let list = connectors::list(&*store, tenant).await?;
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!("{:<32}  {:<5}  {:<13}  url", "name", "kind", "guarantee");
                for c in &list {
                    println!(
                        "{:<32}  {:<5}  {:<13}  {}",
                        c.name, c.kind, c.guarantee, c.url
                    );
                }
            }
        }
        ConnectorCommand::Show { tenant, name, json } => {
            let view = connectors::show(&*store, tenant, &name).await?;
            if json {
                println!("{}", serde_json::to_string(&view)?);
            } else {
                println!("name       {}", view.name);
                println!("kind       {}", view.kind);
                println!("url        {}", view.url);
                if let Some(attribute) = view.match_attribute {
                    println!("match      {attribute}");
                }
                println!("guarantee  {}", view.guarantee);
                println!("created    {}", view.created_at);
                println!("updated    {}", view.updated_at);
            }
        }
        ConnectorCommand::Delete { tenant, name } => {
            connectors::delete(&*store, tenant, &name).await?;
            println!("connector {name} deleted");
        }
    }
    Ok(())
}
