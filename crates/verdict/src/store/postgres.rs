//! The shared backend: PostgreSQL, for several stateless `verdict` instances and workers.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use tokio::sync::Notify;

use super::StoreError;
use super::postgres_hosts::{self, Switched, follow_writable};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Group commits running at once: two overlap one batch's commit with the next batch's
/// statements; more make smaller batches (measured: four gave lower throughput and a p99 twice
/// as long at c=32).
const COMMITTERS: usize = 2;

/// The longest a statement waits for a connection, reconnecting included. While the database
/// is down every acquire waits this long and then fails as transient, so a request answers 503
/// within about this (work queued behind a batch that met the outage fails with it) instead of
/// waiting out the outage. At normal load a connection is idle or opened in milliseconds.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(1);

/// PostgreSQL-backed storage.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// With several hosts, the task that keeps new connections on the one that takes writes;
    /// it stops with the last clone of the store.
    _follower: Option<Arc<AbortOnDrop>>,
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PostgresStore {
    /// Connects to the database a `postgres://` URL names. With several hosts
    /// (`postgres://h1:p1,h2:p2/db`) it connects to the first that takes writes and follows a
    /// failover to another ([`postgres_hosts`]).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // The group commit's multi-row statements differ by row count: keep every shape
        // prepared instead of re-planning them as they evict each other.
        let hosts: Arc<[PgConnectOptions]> = postgres_hosts::split_hosts(url)
            .map_err(|e| StoreError::Database(sqlx::Error::Configuration(e.into())))?
            .iter()
            .map(|url| {
                Ok(PgConnectOptions::from_str(url)?
                    .statement_cache_capacity(super::pipeline::STATEMENT_SHAPES))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?
            .into();
        let options = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // sqlx pings every idle connection it hands out: one more round trip per batch and
            // per read, measured at 7-13% of fresh-signal throughput. A connection that broke
            // while idle (the database restarted, a failover) fails its first statement
            // instead: a transaction's `BEGIN` is retried on another connection (below), and
            // any other statement's failure is transient (503, the client retries).
            .test_before_acquire(false);
        if hosts.len() == 1 {
            let pool = options.connect_with(hosts[0].clone()).await?;
            return Ok(Self {
                pool,
                _follower: None,
            });
        }
        let current = postgres_hosts::first_writable(&hosts)
            .await
            .map_err(|why| {
                StoreError::Unavailable(sqlx::Error::Configuration(
                    format!("no database host takes writes ({why})").into(),
                ))
            })?;
        let wake = Arc::new(Notify::new());
        let woken = wake.clone();
        let switched = Arc::new(Switched::default());
        let since_switch = switched.clone();
        let pool = options
            // A connection opened before new connections moved to another host is closed.
            .before_acquire(move |_, meta| {
                let current = since_switch.is_current(meta.age);
                Box::pin(async move { Ok(current) })
            })
            // A new connection that lands on a read-only host (a standby not yet promoted, a
            // demoted primary) is refused, and the follower looks for the new primary at once.
            .after_connect(move |conn, _| {
                let wake = woken.clone();
                Box::pin(async move {
                    if postgres_hosts::takes_writes(conn).await? {
                        return Ok(());
                    }
                    wake.notify_one();
                    Err(sqlx::Error::Configuration(
                        "connected to a read-only database host".into(),
                    ))
                })
            })
            .connect_with(hosts[current].clone())
            .await?;
        tracing::info!(
            host = %postgres_hosts::label(&hosts[current]),
            hosts = hosts.len(),
            "connected to the database host that takes writes"
        );
        let follower = tokio::spawn(follow_writable(
            pool.clone(),
            hosts,
            current,
            wake,
            switched,
        ));
        Ok(Self {
            pool,
            _follower: Some(Arc::new(AbortOnDrop(follower))),
        })
    }

    /// The pool every statement goes through (PostgreSQL has no single-writer limit).
    pub fn write(&self) -> &PgPool {
        &self.pool
    }

    /// The same pool, for reads.
    pub fn read(&self) -> &PgPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.begin_with("BEGIN").await
    }

    /// Opens a transaction with `begin` (a `BEGIN` statement). A `BEGIN` that fails because
    /// its connection broke while idle changed nothing, so it is tried again on another (the
    /// pool drops the broken one), for at most about one acquire timeout.
    async fn begin_with(
        &self,
        begin: &'static str,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let started = std::time::Instant::now();
        let mut tries = 0;
        loop {
            match self.pool.begin_with(begin).await {
                Err(err)
                    if broken_connection(&err)
                        && tries < BEGIN_RETRIES
                        && started.elapsed() < ACQUIRE_TIMEOUT =>
                {
                    tries += 1;
                }
                result => return result,
            }
        }
    }
}

/// Broken connections `begin_with` may meet in a row (the pool's size) before it gives up.
const BEGIN_RETRIES: usize = 16;

/// Whether an error means the connection itself is gone rather than the statement refused.
fn broken_connection(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
}

/// Leases due deliveries; `SKIP LOCKED` lets several workers share the queue without waiting on
/// or double-leasing each other's rows.
/// How a read that must see one snapshot begins (one snapshot for every statement of a read transaction).
const READ_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

const LEASE_DUE: &str = "UPDATE deliveries SET leased_until = $2 WHERE id IN ( \
     SELECT d.id FROM deliveries d JOIN tenants t ON t.id = d.tenant_id \
     WHERE d.status = 'pending' AND d.next_attempt_at <= $1 AND d.leased_until <= $1 \
     AND d.updated_at < $4 AND d.retries_left > 0 AND NOT t.callback_disabled \
     AND d.tenant_id::text NOT IN (SELECT jsonb_array_elements_text($5::jsonb)) \
     ORDER BY d.next_attempt_at LIMIT $3 FOR UPDATE OF d SKIP LOCKED) \
     RETURNING id, tenant_id, webhook_id, payload, retries_left, \
     (SELECT callback_url FROM tenants WHERE tenants.id = deliveries.tenant_id) AS callback_url";

/// Whether a query may hold several statements: PostgreSQL prepares one statement per query.
const MULTI_STATEMENT: bool = false;

sql_store!(PostgresStore, sqlx::PgConnection, LEASE_DUE, COMMITTERS);

/// The group commit in fewer statements ([`super::postgres_pipeline`]): `BEGIN`; one statement
/// for the held locks' re-check, claims, effects, attempts' records, and the outbox rows, events
/// and completions of the acts whose effects came out as expected; for any other act, the
/// outbox, then the events and completions; `COMMIT`.
#[async_trait::async_trait]
impl super::PipelineStore for PostgresStore {
    async fn commit(&self, batch: &super::Batch) -> Result<super::BatchResult, StoreError> {
        use super::postgres_pipeline as fused;
        use crate::actions::ActionKind;
        use crate::failpoint::failpoint;
        let mut tx = self.begin_with(fused::BEGIN).await?;
        let found = fused::apply(&mut tx, batch).await?;
        disable_endpoints(&mut tx, &batch.attempts.iter().collect::<Vec<_>>()).await?;
        let live = super::pipeline::live_acts(batch, |i, _| fused::held(&found, i));
        for action in ActionKind::LOCAL {
            if live
                .iter()
                .any(|&i| batch.acts[i].effects.contains(&action))
            {
                failpoint!(crate::failpoint::after_action(action));
            }
        }
        // The acts APPLY did not settle are finished with their actual outcomes.
        let unsettled = fused::unsettled(&live, &found);
        let mut outcomes = fused::outcomes_of(batch, &unsettled, &found);
        let deliveries = fused::outbox(&mut tx, batch, &unsettled, &mut outcomes).await?;
        let finished: Vec<super::pipeline::Finished> = unsettled
            .iter()
            .zip(&outcomes)
            .map(|(&i, o)| batch.acts[i].finished_for(o))
            .collect();
        let completions: Vec<_> = unsettled
            .iter()
            .zip(&finished)
            .filter_map(|(&i, f)| batch.acts[i].held.as_ref().map(|h| (h, &f.response)))
            .collect();
        fused::finish(&mut tx, &finished, &completions).await?;
        if !live.is_empty() {
            failpoint!("act::before_commit");
        }
        tx.commit().await?;

        let (outcomes, finished, deliveries) =
            fused::in_live_order(batch, &live, &found, outcomes, finished, deliveries)?;
        let claims = fused::claims_won(batch, &found);
        Ok(super::pipeline::batch_result(
            batch, live, outcomes, finished, deliveries, claims,
        ))
    }
}
