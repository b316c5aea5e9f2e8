//! `verdict serve`: the API and the console composed, the background pruner, and graceful
//! shutdown.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::response::Redirect;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::{self, AppState, Shared, connections};
use crate::clock::now_ms;
use crate::config::{Config, ServeConfig};
use crate::console;
use crate::delivery::{self, Deliverer, DeliverySettings, worker};
use crate::feeds::jwks::{self, KeyCache};
use crate::feeds::set::SetReceiver;
use crate::http;
use crate::ingest::Ingest;
use crate::rate_limit::RateLimits;
use crate::retention::{self, Pruner, RetentionSettings, RetentionStore};
use crate::secrets::{Keyring, SecretsError};
use crate::store::{self, Store};
use crate::tenant::Credentials;

/// Histogram buckets (seconds) for request and delivery latencies.
const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Opens the master key and the database (migrated), refusing a key other than the one the
/// database was set up with: each process that seals or opens secrets starts here, so a wrong
/// key stops it at once instead of failing every signal it would serve.
pub async fn open(config: &Config) -> anyhow::Result<(Keyring, Arc<dyn Store>)> {
    let keys = config.master_key()?.keyring();
    let store = store::connect(&config.database_url)
        .await
        .context("connecting to the database")?;
    let stored = store
        .stored_sentinel()
        .await
        .context("reading the master key's sentinel")?;
    let stored = match stored {
        Some(stored) => stored,
        None => {
            // A database set up before sentinels existed: its secrets say which key it has,
            // so the first sentinel is never stored under a wrong one.
            let witness = store
                .oldest_sealed_secret()
                .await
                .context("reading a sealed secret to check the master key against")?;
            if let Some((tenant_id, secret)) = witness
                && !crate::tenant::opens_under(&keys, tenant_id, &secret)
            {
                return Err(SecretsError::WrongMasterKey.into());
            }
            store
                .master_key_sentinel(&keys.sentinel(), now_ms())
                .await
                .context("storing the master key's sentinel")?
        }
    };
    keys.check_sentinel(&stored)?;
    Ok((keys, store))
}

/// Runs the API until SIGINT or SIGTERM.
pub async fn serve(config: &Config, serve: ServeConfig) -> anyhow::Result<()> {
    let (keys, store) = open(config).await?;
    let keys = Arc::new(keys);
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .and_then(|b| b.install_recorder())
        .ok();
    let deliverer = Arc::new(Deliverer::new(store.clone(), keys.clone(), serve.delivery)?);
    let sets = Arc::new(SetReceiver::new(
        store.clone(),
        serve.sets.window,
        KeyCache::new(
            delivery::guarded_client(serve.delivery.destinations, jwks::FETCH_TIMEOUT)?,
            serve.delivery.destinations,
            serve.sets.jwks_refresh,
        ),
    ));
    let ingest = Arc::new(Ingest::new(
        store.clone(),
        store.concurrent_commits(),
        store.commit_gathering(),
        keys.clone(),
        serve.ingest,
        deliverer.clone(),
    ));
    let quota = Arc::new(crate::quota::DailyQuota::new(
        serve.quota.max_events_per_day,
    ));
    let state = AppState::new(Shared {
        ingest: ingest.clone(),
        deliverer: deliverer.clone(),
        credentials: Arc::new(Credentials::new(store.clone(), keys.clone())),
        rate_limits: Arc::new(RateLimits::new(serve.rate_limit_per_tenant)),
        sets,
        console: Arc::new(console::Console::new(serve.console_sessions)),
        store: store.clone(),
        keys,
        metrics,
        metrics_token: serve.metrics_token.clone(),
        simulations: Default::default(),
        quota: quota.clone(),
    });
    let shutdown = CancellationToken::new();
    let background = TaskTracker::new();
    background.spawn(crate::quota::run(
        quota,
        store.clone(),
        serve.quota.sync,
        shutdown.clone(),
    ));
    background.spawn(prune(
        store,
        Duration::from_secs(serve.prune_interval_secs),
        serve.retention,
        shutdown.clone(),
    ));
    if serve.run_worker {
        background.spawn(worker::run(
            deliverer,
            serve.delivery.retry_interval,
            shutdown.clone(),
        ));
    }
    background.close();

    let listener = tokio::net::TcpListener::bind(serve.listen)
        .await
        .with_context(|| format!("binding {}", serve.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    let stop = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        stop.cancel();
    });
    connections::serve(listener, router(state), serve.inbound, shutdown.clone()).await;
    ingest.drain().await;
    background.wait().await;
    tracing::info!("stopped");
    Ok(())
}

/// The whole app: the API, the console under `/console`, and the layers every request passes
/// through. The one place the two edges meet.
pub fn router(state: AppState) -> Router {
    app::layered(
        http::router().nest("/console", console::router()).route(
            "/console/",
            get(|| async { Redirect::to("/console/events") }),
        ),
        state,
    )
}

/// `verdict worker`: the delivery worker on its own, every `interval`, or one round.
pub async fn work(config: &Config, delivery: DeliverySettings, once: bool) -> anyhow::Result<()> {
    let (keys, store) = open(config).await?;
    let keys = Arc::new(keys);
    let deliverer = Arc::new(Deliverer::new(store, keys, delivery)?);
    let stop = CancellationToken::new();
    if once {
        let round = worker::round(&deliverer, &stop).await?;
        tracing::info!(
            attempted = round.attempted,
            delivered = round.delivered,
            "delivery round done"
        );
        println!(
            "{}",
            serde_json::json!({"attempted": round.attempted, "delivered": round.delivered})
        );
        return Ok(());
    }
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signal_stop.cancel();
    });
    tracing::info!(
        interval_secs = delivery.retry_interval.as_secs(),
        "delivery worker started"
    );
    worker::run(deliverer, delivery.retry_interval, stop).await;
    Ok(())
}

/// Batches of each kind one pruning run deletes at most before it reports and checks for
/// shutdown; a run that stops there with a backlog left is followed at once by another.
const PRUNE_BATCHES_PER_RUN: usize = 20;

/// Deletes expired idempotency keys and what is past retention, on a schedule; a backlog is
/// worked off run after run, each batch its own short transaction, until none is left.
async fn prune(
    store: Arc<dyn RetentionStore>,
    every: Duration,
    retention: RetentionSettings,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(every);
    let mut pruner = Pruner::resumed(&*store, now_ms()).await;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // A run that stopped at its bound with rows left is followed by another at once, so a
        // backlog is worked off without waiting for the next tick.
        loop {
            let progress = tokio::select! {
                _ = stop.cancelled() => return,
                progress = prune_run(&*store, retention, &mut pruner) => progress,
            };
            if let Err(err) = pruner.save(&*store).await {
                tracing::warn!(error = ?err, "saving the pruner's sweep failed");
            }
            if progress == retention::Progress::Done {
                break;
            }
        }
    }
}

/// One bounded pruning run, logged; a failed one is retried at the next tick.
async fn prune_run(
    store: &dyn RetentionStore,
    retention: RetentionSettings,
    pruner: &mut Pruner,
) -> retention::Progress {
    match pruner
        .run(store, retention, now_ms(), PRUNE_BATCHES_PER_RUN)
        .await
    {
        Ok((pruned, progress)) => {
            if !pruned.is_empty() {
                tracing::info!(
                    idempotency_keys = pruned.idempotency_keys,
                    events = pruned.events,
                    deliveries = pruned.deliveries,
                    delivery_attempts = pruned.delivery_attempts,
                    playbook_versions = pruned.playbook_versions,
                    longest_batch_ms = pruned.longest_batch_ms,
                    "pruned past retention"
                );
            }
            progress
        }
        Err(err) => {
            tracing::warn!(error = ?err, "pruning past retention failed");
            retention::Progress::Done
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
