//! `verdict deliveries …`: list, show, redeliver and resolve a tenant's callbacks and connector
//! calls.

use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;
use uuid::Uuid;

use crate::config::{Config, DeliveryArgs};
use crate::delivery::resolve::{self, Settled};
use crate::delivery::{REDELIVER_INTERVAL, Redelivered};
use crate::http::{DeliveryDetail, DeliveryView};

/// `verdict deliveries …`.
#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List a tenant's deliveries, newest first.
    List {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// pending, succeeded, failed, dead, unknown or suspended.
        #[arg(long)]
        status: Option<crate::delivery::DeliveryStatus>,
        /// Only the callbacks of the endpoint of this name.
        #[arg(long)]
        endpoint: Option<crate::domain::EndpointName>,
        /// At most this many (1 to 10000).
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Print one JSON array, as `GET /v1/deliveries` shows each.
        #[arg(long)]
        json: bool,
    },
    /// Show one delivery and its attempts.
    Show {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The delivery's id (from `list`, or an event's deliveries).
        id: Uuid,
        /// Print one JSON object, as `GET /v1/deliveries/{id}` shows it.
        #[arg(long)]
        json: bool,
    },
    /// Attempt a delivery again now, with the same webhook-id, and a fresh retry budget.
    Redeliver {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The delivery's id (from `list`, or an event's deliveries).
        id: Uuid,
        #[command(flatten)]
        delivery: DeliveryArgs,
        /// Print the delivery as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Settle an action request whose outcome is unknown (an at-most-once connector's call
    /// that may or may not have acted) as done or failed, once the tenant's system says which.
    Resolve {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The delivery's id (from `list`, or an event's deliveries).
        id: Uuid,
        /// What the request did: done or failed.
        #[arg(long)]
        outcome: Settled,
        /// Why, for the record (1 to 500 characters).
        #[arg(long)]
        reason: String,
        /// Print the delivery as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub(super) async fn run_deliveries(
    config: &Config,
    file: &crate::config::FileConfig,
    cmd: DeliveriesCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    let keys = Arc::new(keys);
    // A delivery after a change, read back with its attempts.
    let detail = |tenant: Uuid, id: Uuid| {
        let store = store.clone();
        async move {
            let (d, attempts) = store
                .delivery_with_attempts(tenant, id)
                .await?
                .context("no such delivery")?;
            anyhow::Ok(DeliveryDetail::new(d, attempts))
        }
    };
    match cmd {
        DeliveriesCommand::List {
            tenant,
            status,
            endpoint,
            limit,
            json,
        } => {
            let rows: Vec<DeliveryView> = store
                .deliveries(
                    tenant,
                    status,
                    endpoint.as_ref(),
                    None,
                    limit.clamp(1, 10_000),
                )
                .await?
                .into_iter()
                .map(DeliveryView::from)
                .collect();
            if json {
                println!("{}", serde_json::to_string(&rows)?);
            } else {
                print_list(&rows);
            }
        }
        DeliveriesCommand::Show { tenant, id, json } => {
            print_detail(&detail(tenant, id).await?, json)?;
        }
        DeliveriesCommand::Redeliver {
            tenant,
            id,
            delivery,
            json,
        } => {
            let deliverer =
                crate::delivery::Deliverer::new(store.clone(), keys, delivery.resolve(file)?)?;
            match deliverer.redeliver(tenant, id).await? {
                Redelivered::Attempted(verdict) => {
                    tracing::info!(?verdict, "redelivered");
                    print_detail(&detail(tenant, id).await?, json)?;
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
        DeliveriesCommand::Resolve {
            tenant,
            id,
            outcome,
            reason,
            json,
        } => {
            // The CLI acts as the operator with no API key: recorded as the nil key.
            resolve::resolve(&*store, tenant, id, outcome, &reason, Uuid::nil()).await?;
            print_detail(&detail(tenant, id).await?, json)?;
        }
    }
    Ok(())
}

/// One line per delivery: what it is, where it stands, when it is tried next.
fn print_list(rows: &[DeliveryView]) {
    println!(
        "{:<36}  {:<9}  {:<16}  {:>8}  next attempt",
        "id", "status", "action", "attempts"
    );
    for d in rows {
        println!(
            "{:<36}  {:<9}  {:<16}  {:>8}  {}",
            d.delivery.id,
            d.delivery.status,
            d.delivery.action,
            d.attempts,
            d.delivery.next_attempt_at.as_deref().unwrap_or("-")
        );
    }
}

/// A delivery's fields, then one line per attempt (oldest first).
fn print_detail(d: &DeliveryDetail, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(d)?);
        return Ok(());
    }
    let s = &d.delivery;
    let or_dash = |v: Option<&str>| v.unwrap_or("-").to_owned();
    println!("id               {}", s.id);
    println!("event_id         {}", s.event_id);
    println!("webhook_id       {}", s.webhook_id);
    println!("action           {}", s.action);
    println!("connector        {}", or_dash(s.connector.as_deref()));
    println!("status           {}", s.status);
    println!("next_attempt_at  {}", or_dash(s.next_attempt_at.as_deref()));
    println!("last_error       {}", or_dash(s.last_error.as_deref()));
    println!("created_at       {}", s.created_at);
    println!("attempts         {}", d.attempts.len());
    for a in &d.attempts {
        let status = a
            .status_code
            .map_or_else(|| "-".to_owned(), |c| c.to_string());
        println!(
            "  {}  {:<9}  {:>3}  {:>6} ms  {}",
            a.attempted_at,
            a.trigger,
            status,
            a.latency_ms,
            a.error.as_deref().or(a.reason.as_deref()).unwrap_or("")
        );
    }
    Ok(())
}
