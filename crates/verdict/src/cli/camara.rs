//! `verdict camara …`: the tenant's CAMARA SIM Swap subscriptions.

use clap::Subcommand;
use uuid::Uuid;

use crate::config::Config;

/// `verdict camara …`.
#[derive(Debug, Subcommand)]
pub enum CamaraCommand {
    /// The tenant's CAMARA SIM Swap subscriptions.
    #[command(subcommand)]
    Subscription(CamaraSubscriptionCommand),
}

/// `verdict camara subscription …`.
#[derive(Debug, Subcommand)]
pub enum CamaraSubscriptionCommand {
    /// Register the phone a subscription is about: its notifications may then leave
    /// `phoneNumber` out (3-legged subscriptions). Both are stored only as keyed digests.
    Add {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The `subscriptionId` the carrier returned when the subscription was created.
        #[arg(long)]
        subscription_id: String,
        /// The subscription's phone number, E.164 (`+` and digits); `-` reads it from the first
        /// line of stdin, so it stays out of the process list and the shell's history.
        #[arg(long)]
        phone: String,
    },
    /// Forget a registered subscription.
    Remove {
        /// The tenant's id.
        #[arg(long, env = super::TENANT_ENV)]
        tenant: Uuid,
        /// The subscription's `subscriptionId`.
        #[arg(long)]
        subscription_id: String,
    },
}

pub(super) async fn run_camara(
    config: &Config,
    cmd: CamaraSubscriptionCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    match cmd {
        CamaraSubscriptionCommand::Add {
            tenant,
            subscription_id,
            phone,
        } => {
            let phone = super::value_or_stdin(&phone)?;
            crate::feeds::add_camara_subscription(&*store, &keys, tenant, subscription_id, phone)
                .await?;
            println!("subscription registered");
        }
        CamaraSubscriptionCommand::Remove {
            tenant,
            subscription_id,
        } => {
            if crate::feeds::remove_camara_subscription(&*store, &keys, tenant, &subscription_id)
                .await?
            {
                println!("subscription removed");
            } else {
                anyhow::bail!("no such subscription is registered for tenant {tenant}");
            }
        }
    }
    Ok(())
}
