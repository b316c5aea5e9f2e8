//! `verdict deliveries …`: list, show, redeliver and resolve a tenant's callbacks and connector
//! calls.

use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;
use uuid::Uuid;

use crate::config::{Config, DeliveryArgs};
use crate::delivery::resolve::{self, Settled};
use crate::delivery::{REDELIVER_INTERVAL, Redelivered};

/// `verdict deliveries …`.
#[derive(Debug, Subcommand)]
pub enum DeliveriesCommand {
    /// List a tenant's deliveries, newest first, as JSON lines.
    List {
        #[arg(long)]
        tenant: Uuid,
        /// pending, succeeded, failed, dead, unknown or suspended.
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
    /// Settle an action request whose outcome is unknown (an at-most-once connector's call
    /// that may or may not have acted) as done or failed, once the tenant's system says which.
    Resolve {
        #[arg(long)]
        tenant: Uuid,
        id: Uuid,
        /// What the request did: done or failed.
        #[arg(long)]
        outcome: Settled,
        /// Why, for the record (1 to 500 characters).
        #[arg(long)]
        reason: String,
    },
}

pub(super) async fn run_deliveries(
    config: &Config,
    file: &crate::config::FileConfig,
    cmd: DeliveriesCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    let keys = Arc::new(keys);
    let show = |d: crate::store::DeliveryRecord| {
        serde_json::json!({
            "id": d.id, "event_id": d.event_id, "webhook_id": d.webhook_id,
            "status": d.status.as_str(), "attempts": d.attempts, "last_error": d.last_error,
            "action": d.action, "connector": d.connector,
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
            let (d, attempts) = store
                .delivery_with_attempts(tenant, id)
                .await?
                .context("no such delivery")?;
            let attempts: Vec<_> = attempts
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
        DeliveriesCommand::Resolve {
            tenant,
            id,
            outcome,
            reason,
        } => {
            // The CLI acts as the operator with no API key: recorded as the nil key.
            let d = resolve::resolve(&*store, tenant, id, outcome, &reason, Uuid::nil()).await?;
            println!("{}", show(d));
        }
    }
    Ok(())
}
