//! `verdict subject …`: find a subject by the identifier an analyst holds, and take the way
//! back (unlock, lift a deny, close a case), as `POST /v1/subjects/…` does, always under an
//! idempotency key (`--idempotency-key`, a fresh one by default).

use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::config::{Config, DeliveryArgs, FileConfig, KeyLifetimeArgs};
use crate::domain::ActionKind;
use crate::idempotency::IdempotencyKey;
use crate::playbook::{Format, Playbook, current_source};
use crate::signal::subject_of;
use crate::subjects::{self, Answer, Asked, Keying, Means, Operator};

/// Who: exactly one of a phone number or an account.
#[derive(Debug, Args)]
pub struct Who {
    /// The tenant's id.
    #[arg(long, env = super::TENANT_ENV)]
    tenant: Uuid,
    /// The subject's phone number (E.164); `-` reads it from the first line of stdin, so it
    /// stays out of the process list and the shell's history.
    #[arg(long, required_unless_present = "account", conflicts_with = "account")]
    phone: Option<String>,
    /// The subject's account; `-` reads it from the first line of stdin.
    #[arg(long)]
    account: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

impl Who {
    /// The subject named, with a `-` read from stdin.
    fn subject(&self) -> anyhow::Result<crate::signal::Subject> {
        let phone = self
            .phone
            .as_deref()
            .map(super::value_or_stdin)
            .transpose()?;
        let account = self
            .account
            .as_deref()
            .map(super::value_or_stdin)
            .transpose()?;
        Ok(subject_of(phone, account)?)
    }
}

/// `verdict subject …`.
#[derive(Debug, Subcommand)]
pub enum SubjectCommand {
    /// Print the subject's lock, deny, open cases and newest events.
    Lookup {
        #[command(flatten)]
        who: Who,
    },
    /// Remove the subject's account lock, here and through `lock_account`'s connector.
    Unlock(WayBackArgs),
    /// Lift the subject's standing deny.
    LiftDeny(WayBackArgs),
    /// Close the subject's open case.
    CloseCase(WayBackArgs),
}

/// Who, why, and how to reach the connector.
#[derive(Debug, Args)]
pub struct WayBackArgs {
    #[command(flatten)]
    who: Who,
    /// Why, for the record (1 to 500 characters).
    #[arg(long)]
    reason: String,
    /// The way back's idempotency key (1 to 255 visible ASCII characters): run again with the
    /// same key and reason, it answers as the first run did and does nothing again. Default: a
    /// fresh UUIDv4.
    #[arg(long)]
    idempotency_key: Option<String>,
    #[command(flatten)]
    keys: KeyLifetimeArgs,
    #[command(flatten)]
    delivery: DeliveryArgs,
}

pub(super) async fn run_subject(
    config: &Config,
    file: &FileConfig,
    cmd: SubjectCommand,
) -> anyhow::Result<()> {
    let (keys, store) = crate::server::open(config).await?;
    let keys = Arc::new(keys);
    let (action, args) = match cmd {
        SubjectCommand::Lookup { who } => {
            let subject = who.subject()?;
            let (digest, state) = subjects::lookup(&*store, &keys, who.tenant, &subject)
                .await?
                .context("the tenant has no event about this subject")?;
            let out = serde_json::json!({
                "subject_hash": crate::secrets::hex(&digest),
                "lock": state.lock.map(|(event, _)| event),
                "deny": state.deny.map(|(event, _)| event),
                "open_cases": state.open_cases.iter().map(|c| c.0).collect::<Vec<_>>(),
                "events": state.events,
            });
            if who.json {
                println!("{out}");
            } else {
                print_state(&out);
            }
            return Ok(());
        }
        SubjectCommand::Unlock(args) => (ActionKind::UnlockAccount, args),
        SubjectCommand::LiftDeny(args) => (ActionKind::LiftDeny, args),
        SubjectCommand::CloseCase(args) => (ActionKind::CloseCase, args),
    };
    let tenant = args.who.tenant;
    let json = args.who.json;
    let subject = args.who.subject()?;
    let stored = current_source(&*store, tenant).await?;
    let format = Format::from_name(&stored.format).unwrap_or(Format::Toml);
    let playbook = Playbook::parse(&stored.source, format)?;
    let key = IdempotencyKey::try_from(
        args.idempotency_key
            .unwrap_or_else(|| Uuid::new_v4().to_string())
            .as_str(),
    )
    .context("--idempotency-key")?;
    let deliverer = Arc::new(crate::delivery::Deliverer::new(
        store.clone(),
        keys.clone(),
        args.delivery.resolve(file)?,
    )?);
    let (key_ttl_ms, lock_timeout_ms) = args.keys.resolve(file)?;
    let background = TaskTracker::new();
    let means = Means {
        store: store.clone(),
        keys: &keys,
        deliverer,
        background: &background,
        keying: Keying {
            key_ttl_ms,
            lock_timeout_ms,
        },
    };
    let asked = Asked {
        // The CLI acts as the operator with no API key: recorded as the nil key.
        operator: Operator {
            tenant_id: tenant,
            key_id: Uuid::nil(),
        },
        playbook: (&playbook, stored.version),
        action,
        subject: &subject,
        reason: &args.reason,
        key: Some(&key),
    };
    let answer = subjects::undo(&means, &asked).await;
    background.close();
    background.wait().await;
    let undone: serde_json::Value = match answer? {
        Answer::Fresh(undone) => serde_json::to_value(&undone)?,
        Answer::Replayed(stored) if stored.status == 200 => serde_json::from_slice(&stored.body)?,
        Answer::Replayed(stored) => anyhow::bail!(
            "the way back under this key failed earlier (HTTP {}): {}",
            stored.status,
            String::from_utf8_lossy(&stored.body)
        ),
    };
    if json {
        println!("{undone}");
    } else {
        let text = |field: &str| undone[field].as_str().unwrap_or("-").to_owned();
        println!("{}: {}", text("action"), text("outcome"));
        println!("subject_hash  {}", text("subject_hash"));
        println!("event_id      {}", text("event_id"));
        println!("connector     {}", text("connector"));
    }
    Ok(())
}

/// A subject's state as lines for a person.
fn print_state(state: &serde_json::Value) {
    let or_dash = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_owned();
    println!("subject_hash  {}", or_dash(&state["subject_hash"]));
    println!("locked by     {}", or_dash(&state["lock"]));
    println!("denied by     {}", or_dash(&state["deny"]));
    let cases: Vec<String> = state["open_cases"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c.to_string())
        .collect();
    println!(
        "open cases    {}",
        if cases.is_empty() {
            "-".to_owned()
        } else {
            cases.join(", ")
        }
    );
    println!(
        "events        {}",
        state["events"].as_array().map_or(0, Vec::len)
    );
}
