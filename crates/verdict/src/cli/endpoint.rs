//! `verdict endpoint …`: a tenant's callback endpoints, as `PUT/GET/DELETE
//! /v1/endpoints/{name}` manages them.

use clap::Subcommand;
use uuid::Uuid;

use crate::config::{Config, DestinationArgs, FileConfig};
use crate::domain::{Decision, EndpointFilter, EndpointName, Feed, SignalType};
use crate::endpoints::{self, EndpointSpec, EndpointView};

/// `verdict endpoint …`.
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Create or replace a callback endpoint. A new endpoint's signing secret is printed once
    /// (`default`, the tenant's callback URL, signs with the tenant's webhook secrets).
    Set {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Its name (`default` is the tenant's callback URL).
        #[arg(long)]
        name: EndpointName,
        /// Where its callbacks are POSTed.
        #[arg(long)]
        url: String,
        /// Take only decisions about this signal type (repeat for several; none: all).
        #[arg(long = "signal-type")]
        signal_types: Vec<SignalType>,
        /// Take only these decisions (repeat for several; none: all).
        #[arg(long = "decision")]
        decisions: Vec<Decision>,
        /// Take only signals from this feed: signals, set or camara (repeat; none: all).
        #[arg(long = "feed")]
        feeds: Vec<Feed>,
        /// Store its callbacks suspended, sending none, until it is set again without this.
        #[arg(long)]
        disabled: bool,
        /// On enabling, leave the callbacks suspended meanwhile as they are instead of
        /// sending each once now.
        #[arg(long)]
        leave_suspended: bool,
        /// Make a new signing secret for an endpoint that exists (the old one stops at once).
        #[arg(long)]
        rotate_secret: bool,
        #[command(flatten)]
        destinations: DestinationArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// List the tenant's callback endpoints (never their secrets).
    List {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// Print one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show one callback endpoint (never its secret).
    Show {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The endpoint's name.
        #[arg(long)]
        name: EndpointName,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Delete a callback endpoint; its callbacks not yet sent then fail.
    Delete {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The endpoint's name.
        #[arg(long)]
        name: EndpointName,
    },
}

pub(super) async fn run_endpoint(
    config: &Config,
    file: &FileConfig,
    cmd: EndpointCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    match cmd {
        EndpointCommand::Set {
            tenant,
            name,
            url,
            signal_types,
            decisions,
            feeds,
            disabled,
            leave_suspended,
            rotate_secret,
            destinations,
            json,
        } => {
            let spec = EndpointSpec {
                url,
                filter: EndpointFilter {
                    signal_types,
                    decisions,
                    feeds,
                },
                enabled: !disabled,
                leave_suspended,
                rotate_secret,
            };
            let policy = destinations.resolve(file);
            let set = endpoints::set(&*store, &keys, tenant, name, spec, policy).await?;
            if json {
                println!("{}", serde_json::to_string(&set)?);
            } else {
                let verb = if set.created { "created" } else { "replaced" };
                println!("endpoint {} {verb}", set.endpoint.name);
                if let Some(secret) = &set.secret_key {
                    println!("secret  {secret}");
                    println!("(the secret is shown once; its callbacks are signed with it)");
                }
                if set.suspended_callbacks > 0 {
                    let what = if set.endpoint.enabled && !leave_suspended {
                        "due again, each sent once"
                    } else {
                        "left suspended"
                    };
                    println!("{} suspended callback(s) {what}", set.suspended_callbacks);
                }
            }
        }
        EndpointCommand::List { tenant, json } => {
            let list = endpoints::list(&*store, tenant).await?;
            if json {
                println!("{}", serde_json::to_string(&list)?);
            } else {
                println!("{:<24}  {:<8}  {:<40}  url", "name", "enabled", "filter");
                for e in &list {
                    println!(
                        "{:<24}  {:<8}  {:<40}  {}",
                        e.name,
                        e.enabled,
                        filter_summary(e),
                        e.url
                    );
                }
            }
        }
        EndpointCommand::Show { tenant, name, json } => {
            let view = endpoints::show(&*store, tenant, &name).await?;
            if json {
                println!("{}", serde_json::to_string(&view)?);
            } else {
                println!("name      {}", view.name);
                println!("url       {}", view.url);
                println!("filter    {}", filter_summary(&view));
                println!("enabled   {}", view.enabled);
                println!("secret    {}", serde_json::to_string(&view.secret)?);
                println!("created   {}", view.created_at);
                println!("updated   {}", view.updated_at);
            }
        }
        EndpointCommand::Delete { tenant, name } => {
            endpoints::delete(&*store, tenant, &name).await?;
            println!("endpoint {name} deleted");
        }
    }
    Ok(())
}

/// An endpoint's filter in a few words: `all`, or each list that narrows it.
fn filter_summary(e: &EndpointView) -> String {
    if e.filter.is_empty() {
        return "all".to_owned();
    }
    let [types, decisions, feeds] = e.filter.columns();
    [("types", types), ("decisions", decisions), ("feeds", feeds)]
        .into_iter()
        .filter(|(_, list)| !list.is_empty())
        .map(|(what, list)| format!("{what}={list}"))
        .collect::<Vec<_>>()
        .join(" ")
}
