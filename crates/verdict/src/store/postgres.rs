//! The shared backend: PostgreSQL, for several stateless `verdict` instances and workers.

use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use tokio::sync::Notify;

use super::postgres_clock;
use super::postgres_hosts::{self, Switched, follow_writable};
use super::{AbortOnDrop, StoreError, answered_within};

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

/// The longest a statement on a request's path (with the connection it waits for) waits for
/// PostgreSQL's answer before it fails as transient: a connection gone silent without closing
/// (a partition) is otherwise waited on until TCP gives up, and with it the group committer
/// holding it and every signal queued behind. Longer than [`ACQUIRE_TIMEOUT`], so an outage
/// still fails as one, and than any statement of a loaded but healthy database (a batch
/// commits in milliseconds, tens under load); short enough that a signal meeting the silence
/// answers 503 within 2 s, as it does during an outage.
const ANSWER_DEADLINE: Duration = Duration::from_millis(1500);

/// `work` within [`ANSWER_DEADLINE`].
async fn answered<T, E>(work: impl Future<Output = Result<T, E>>) -> Result<T, StoreError>
where
    StoreError: From<E>,
{
    answered_within(Some(ANSWER_DEADLINE), work).await
}

/// PostgreSQL connections a process opens at most, both pools together (docs/scale-out.md).
const CONNECTIONS: u32 = 16;

/// Connections of the pipeline pool, out of [`CONNECTIONS`]: one per committer and per
/// decision reader.
const PIPELINE_CONNECTIONS: u32 = COMMITTERS as u32 + super::DECISION_READERS as u32;

/// Connections of the main pool: the rest.
const MAIN_CONNECTIONS: u32 = CONNECTIONS - PIPELINE_CONNECTIONS;

/// Set on every connection when it opens: no statement is compiled with JIT.
///
/// PostgreSQL compiles a statement whose estimated cost passes `jit_above_cost` (100,000 by
/// default), at every execution, and the estimates grow with the tables. Every statement here
/// reads or writes a few rows by index, so the compilation is all cost: on a database of 1.3
/// million events, the playbook pruner's statement (costed at 124,540 for a merge anti join
/// over `events_by_playbook_version`, though it read no row) took 21-27 ms with JIT and
/// 0.25-0.29 without, and on the grown benchmark's 10 million it was the pruner's longest
/// batch after the events' (p90 37-43 ms). A `SET`, for the reason [`PIPELINE_PLANNING`] gives.
const NO_JIT: &str = "SET jit = off";

/// How pipeline connections plan: for lookups by key, whatever the tables' statistics say.
///
/// The pipeline's array statements are planned once per connection and their plan kept (a
/// generic plan, instead of one planned again for every batch). Planned while the tables were
/// small (a new database, before autovacuum first analyses it), the cheapest plan reads a whole
/// table, and it would be kept while the table grows; only index lookups are wanted, so the
/// other plans are turned off. Set once when the connection opens (`after_connect`), so a batch
/// that commits alone needs no `SET` before it; only the pipeline's statements run on these
/// connections. A `SET`, not the startup packet's `options`: PgBouncer refuses a startup
/// `options` parameter ("unsupported startup parameter", 1.18 as Debian ships it), and in its
/// session mode a `SET` holds for the client's whole session (docs/reliability.md).
const PIPELINE_PLANNING: &str = "SET plan_cache_mode = force_generic_plan; \
     SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off";

/// A pipeline connection idle longer than this is pinged before it is handed out: a batch
/// that commits alone cannot be retried on another connection once sent, so a connection that
/// broke while idle (the database restarted) is found before that. Under load none is idle
/// that long, and no batch pays the round trip.
const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A pool's settings: `max` connections, no ping before each use (sqlx pings every idle
/// connection it hands out: one more round trip per batch and per read, measured at 7-13% of
/// fresh-signal throughput; a connection that broke while idle fails its first statement
/// instead, and a transaction's `BEGIN` is retried on another connection, below) except, with
/// `ping_idle`, one idle longer than [`PING_AFTER_IDLE`]; and with several hosts (`follow`),
/// new connections refused on a host that does not take writes and those opened before a
/// switch to another host closed.
/// Every connection compiles nothing with JIT ([`NO_JIT`]); `pipeline` connections are planned
/// for lookups by key ([`PIPELINE_PLANNING`]).
fn pool_options(
    max: u32,
    follow: Option<(Arc<Notify>, Arc<Switched>)>,
    pipeline: bool,
) -> PgPoolOptions {
    let ping_idle = pipeline;
    let mut options = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false);
    let switched = follow.as_ref().map(|(_, switched)| switched.clone());
    if switched.is_some() || ping_idle {
        options = options.before_acquire(move |conn, meta| {
            let current = switched.as_ref().is_none_or(|s| s.is_current(meta.age));
            Box::pin(async move {
                if !current {
                    return Ok(false);
                }
                if ping_idle {
                    return ping_if_idle(conn, meta).await;
                }
                Ok(true)
            })
        });
    }
    let wake = follow.map(|(wake, _)| wake);
    options.after_connect(move |conn, _| {
        let wake = wake.clone();
        Box::pin(async move {
            sqlx::raw_sql(NO_JIT).execute(&mut *conn).await?;
            if pipeline {
                sqlx::raw_sql(PIPELINE_PLANNING).execute(&mut *conn).await?;
            }
            // A new connection that lands on a read-only host (a standby not yet promoted, a
            // demoted primary) is refused, and the follower looks for the new primary at once.
            let Some(wake) = wake else {
                return Ok(());
            };
            if postgres_hosts::takes_writes(conn).await? {
                return Ok(());
            }
            wake.notify_one();
            Err(sqlx::Error::Configuration(
                "connected to a read-only database host".into(),
            ))
        })
    })
}

/// Whether a connection may be handed out: yes, unless it was idle longer than
/// [`PING_AFTER_IDLE`] and does not answer a ping.
async fn ping_if_idle(
    conn: &mut sqlx::PgConnection,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    use sqlx::Connection;
    if meta.idle_for <= PING_AFTER_IDLE {
        return Ok(true);
    }
    Ok(conn.ping().await.is_ok())
}

/// PostgreSQL-backed storage.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The group commit's and the decision reads' connections, planned for lookups by key
    /// ([`PIPELINE_PLANNING`]).
    pipeline: PgPool,
    /// With several hosts, the task that keeps new connections on the one that takes writes;
    /// it stops with the last clone of the store.
    _follower: Option<Arc<AbortOnDrop>>,
    /// The task that keeps this process's clock on the database's ([`postgres_clock`]).
    _clock: Arc<AbortOnDrop>,
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
        let pipeline_hosts = hosts.clone();
        if hosts.len() == 1 {
            let pool = pool_options(MAIN_CONNECTIONS, None, false)
                .connect_with(hosts[0].clone())
                .await?;
            let pipeline = pool_options(PIPELINE_CONNECTIONS, None, true)
                .connect_lazy_with(pipeline_hosts[0].clone());
            let clock = follow_clock(&pool).await?;
            return Ok(Self {
                pool,
                pipeline,
                _follower: None,
                _clock: clock,
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
        let switched = Arc::new(Switched::default());
        let follow = Some((wake.clone(), switched.clone()));
        let pool = pool_options(MAIN_CONNECTIONS, follow.clone(), false)
            .connect_with(hosts[current].clone())
            .await?;
        let pipeline = pool_options(PIPELINE_CONNECTIONS, follow, true)
            .connect_lazy_with(pipeline_hosts[current].clone());
        tracing::info!(
            host = %postgres_hosts::label(&hosts[current]),
            hosts = hosts.len(),
            "connected to the database host that takes writes"
        );
        let follower = tokio::spawn(follow_writable(
            vec![(pool.clone(), hosts), (pipeline.clone(), pipeline_hosts)],
            current,
            wake,
            switched,
        ));
        let clock = follow_clock(&pool).await?;
        Ok(Self {
            pool,
            pipeline,
            _follower: Some(Arc::new(AbortOnDrop(follower))),
            _clock: clock,
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

    /// The pool the decision reads go through: the pipeline's, whose connections keep one
    /// plan of the read instead of planning it again for every batch.
    pub fn decisions(&self) -> &PgPool {
        &self.pipeline
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.begin_with("BEGIN").await
    }

    /// Opens a transaction on the main pool with `begin` ([`begin_on`]).
    async fn begin_with(
        &self,
        begin: &'static str,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        begin_on(&self.pool, begin).await
    }
}

/// Puts this process's clock on the database's before the first request, and keeps it there.
async fn follow_clock(pool: &PgPool) -> Result<Arc<AbortOnDrop>, StoreError> {
    postgres_clock::measure(pool).await?;
    Ok(Arc::new(AbortOnDrop(tokio::spawn(postgres_clock::follow(
        pool.clone(),
    )))))
}

/// Opens a transaction on `pool` with `begin` (a `BEGIN` statement). A `BEGIN` that fails
/// because its connection broke while idle changed nothing, so it is tried again on another
/// (the pool drops the broken one), for at most about one acquire timeout.
async fn begin_on(
    pool: &PgPool,
    begin: &'static str,
) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let started = std::time::Instant::now();
    let mut tries = 0;
    loop {
        match pool.begin_with(begin).await {
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

/// Broken connections [`begin_on`] may meet in a row (as many as both pools hold) before it
/// gives up.
const BEGIN_RETRIES: usize = CONNECTIONS as usize;

/// Whether an error means the connection itself is gone rather than the statement refused.
fn broken_connection(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Io(_) | sqlx::Error::Protocol(_))
}

/// How a transaction whose statements are planned once for any parameters begins: one simple
/// query, so one round trip.
const BEGIN_GENERIC: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan";

/// How a read that must see one snapshot begins (one snapshot for every statement of a read transaction).
const READ_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// Leases due deliveries; `SKIP LOCKED` lets several workers share the queue without waiting on
/// or double-leasing each other's rows.
static LEASE_DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE deliveries SET leased_until = $2 WHERE id IN ( \
         SELECT d.id FROM delivery_queue q JOIN deliveries d ON d.id = q.id \
         JOIN tenants t ON t.id = d.tenant_id \
         WHERE q.next_attempt_at <= $1 AND d.status = 'pending' \
         AND d.next_attempt_at = q.next_attempt_at AND d.leased_until <= $1 \
         AND d.updated_at < $4 AND d.retries_left > 0 \
         AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id AND e.disabled) \
         AND d.tenant_id::text NOT IN (SELECT jsonb_array_elements_text($5::jsonb)) \
         ORDER BY q.next_attempt_at LIMIT $3 FOR UPDATE OF d SKIP LOCKED) \
         RETURNING {}",
        super::deliveries::DUE_COLUMNS
    )
});

impl super::backend::SqlDb for Postgres {
    /// PostgreSQL prepares one statement per query.
    const MULTI_STATEMENT: bool = false;

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }

    const ROW_ADDRESS: &'static str = "ctid";

    fn address_in(subquery: &str) -> String {
        // `ctid IN (…)` joins; `= ANY (ARRAY(…))` is a TID scan. A row updated meanwhile has
        // moved, so it is left alone, as a fresh look at its columns would require.
        format!("ctid = ANY (ARRAY({subquery}))")
    }

    const SHARE_ROWS: &'static str = " FOR SHARE";

    // `events_by_subject` leads with the event's day (`postgres/0035`), so that a grown
    // database's inserts land beside each other; a subject is found day by day, from the
    // tenant's first day to its last, which the same index gives (ordered by day, which no
    // other index is: never a walk of another tenant's events).
    const SUBJECT_EVENT_IDS: &'static str = "SELECT e.id FROM generate_series( \
         (SELECT created_at / 86400000 FROM events WHERE tenant_id = $1 \
         ORDER BY created_at / 86400000 LIMIT 1), \
         (SELECT created_at / 86400000 FROM events WHERE tenant_id = $1 \
         ORDER BY created_at / 86400000 DESC LIMIT 1)) AS d(day) \
         CROSS JOIN LATERAL (SELECT id FROM events WHERE tenant_id = $1 \
         AND created_at / 86400000 = d.day AND subject_hash = $2) e";
}

impl super::backend::Backend for PostgresStore {
    type Db = Postgres;

    fn read(&self) -> &PgPool {
        &self.pool
    }

    fn write(&self) -> &PgPool {
        &self.pool
    }

    fn decisions(&self) -> &PgPool {
        &self.pipeline
    }

    async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        PostgresStore::begin(self).await
    }

    async fn begin_generic(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.begin_with(BEGIN_GENERIC).await
    }

    const READ_SNAPSHOT: &'static str = READ_SNAPSHOT;
    /// The tenant's row, locked to the transaction's end. `NO KEY UPDATE` leaves alone the
    /// key-share locks that inserts of rows referring to the tenant take.
    const LOCK_TENANT: Option<&'static str> =
        Some("SELECT 1 FROM tenants WHERE id = $1 FOR NO KEY UPDATE");
    fn lease_due() -> &'static str {
        &LEASE_DUE
    }
    const COMMITS: usize = COMMITTERS;
    /// A few decision reads' round trips at low load: at c=8 a batch held about two signals
    /// without it, and a statement's fixed cost was most of a signal's database time.
    const GATHER: Option<Duration> = Some(Duration::from_millis(2));
    const ANSWER_DEADLINE: Option<Duration> = Some(ANSWER_DEADLINE);

    async fn migrate_schema(&self) -> Result<(), sqlx::migrate::MigrateError> {
        MIGRATOR.run(&self.pool).await
    }
}

/// The group commit in fewer statements ([`super::postgres_pipeline`]): one statement, committed
/// on its own, for the held locks' re-check, claims, effects, attempts' records, and the outbox
/// rows, events and completions, when every act that goes ahead settles in it; otherwise
/// `BEGIN`, that statement, and for the acts it did not settle the outbox, then the events and
/// completions, and `COMMIT`.
#[async_trait::async_trait]
impl super::PipelineStore for PostgresStore {
    async fn commit(&self, batch: &super::Batch) -> Result<super::BatchResult, StoreError> {
        use super::postgres_pipeline as fused;
        if fused::may_commit_alone(batch) {
            let mut conn = answered(self.pipeline.acquire()).await?;
            stop_before_one_statement(batch).await?;
            // An answer lost here leaves the batch committed or not: the requests get a 503,
            // and their retries find out which (a completed key replays).
            match answered(fused::apply(&mut conn, batch, true)).await {
                Ok(found) => {
                    let live = fused::live(batch, &found);
                    return fused::result(batch, &found, live, Default::default());
                }
                // Nothing of it was kept: the batch runs again in a transaction.
                Err(err) if fused::left_unsettled(&err) => {
                    metrics::counter!("verdict_group_commit_transactions_total").increment(1);
                }
                Err(err) => return Err(err),
            }
        }
        self.commit_in_transaction(batch).await
    }
}

/// The failpoints of a batch's effects and commit (`act::after_<action>`,
/// `act::before_commit`), on the path that runs them as one statement committed as it ends:
/// there is no point between its effects, so each fires where a crash or failure there would
/// leave the same thing, nothing of the batch, which is before the statement is sent. Tests
/// stop the production path this way instead of forcing the transaction's.
/// Without the `failpoints` feature it does nothing, and scans nothing on the hot path.
async fn stop_before_one_statement(batch: &super::Batch) -> Result<(), StoreError> {
    #[cfg(feature = "failpoints")]
    {
        use crate::domain::ActionKind;
        use crate::store::failpoint::failpoint;
        for action in ActionKind::LOCAL {
            if batch.acts.iter().any(|a| a.effects.contains(&action)) {
                failpoint!(&crate::store::failpoint::after_action(action));
            }
        }
        if !batch.acts.is_empty() {
            failpoint!("act::before_commit");
        }
    }
    #[cfg(not(feature = "failpoints"))]
    let _ = batch;
    Ok(())
}

impl PostgresStore {
    /// A batch in one transaction: `BEGIN`, [`postgres_pipeline::apply`], then for the acts
    /// it did not settle their actual outcomes, `COMMIT`.
    async fn commit_in_transaction(
        &self,
        batch: &super::Batch,
    ) -> Result<super::BatchResult, StoreError> {
        use super::postgres_pipeline as fused;
        use crate::domain::ActionKind;
        use crate::store::failpoint::failpoint;
        // Each statement within its own deadline, so that the failpoints between them (which
        // tests hold for seconds) are not counted.
        let mut tx = answered(begin_on(&self.pipeline, "BEGIN")).await?;
        let found = answered(fused::apply(&mut tx, batch, false)).await?;
        let attempts: Vec<_> = batch.attempts.iter().collect();
        answered(super::deliveries::disable_endpoints(&mut *tx, &attempts)).await?;
        let live = fused::live(batch, &found);
        for action in ActionKind::LOCAL {
            if live
                .iter()
                .any(|&i| batch.acts[i].effects.contains(&action))
            {
                failpoint!(&crate::store::failpoint::after_action(action));
            }
        }
        // The acts APPLY did not settle are finished with their actual outcomes.
        let unsettled = fused::unsettled(&live, &found);
        let mut outcomes = fused::outcomes_of(batch, &unsettled, &found);
        let deliveries = answered(fused::outbox(&mut tx, batch, &unsettled, &mut outcomes)).await?;
        answered(fused::requests(&mut tx, batch, &unsettled, &mut outcomes)).await?;
        let finished: Vec<super::pipeline::Finished> = unsettled
            .iter()
            .zip(&outcomes)
            .map(|(&i, o)| batch.acts[i].finished_for(o))
            .collect();
        let completions: Vec<_> = unsettled
            .iter()
            .zip(&finished)
            .filter_map(|(&i, f)| batch.acts[i].held.as_ref().map(|h| (h, f)))
            .collect();
        answered(fused::finish(&mut tx, &finished, &completions)).await?;
        if !live.is_empty() {
            failpoint!("act::before_commit");
        }
        answered(tx.commit()).await?;
        fused::result(batch, &found, live, (outcomes, finished, deliveries))
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Executor, PgConnection};

    use super::MIGRATOR;

    /// Every shape of the batch's statement is valid on PostgreSQL's schema: each names only
    /// the columns and CTEs it has. (A shape without the held keys' part once left `held`
    /// without its `i`.) Needs the PostgreSQL the tests run against.
    #[tokio::test]
    async fn every_shape_of_the_batch_statement_prepares_on_postgres() {
        let admin_url = std::env::var("VERDICT_TEST_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let mut admin = PgConnection::connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL is required at {admin_url}: {e}"));
        let name = format!("verdict_shapes_{}", uuid::Uuid::new_v4().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await
            .expect("a database of the test's own");
        let url = format!("{}/{name}", &admin_url[..admin_url.rfind('/').unwrap_or(0)]);
        let prepared = async {
            let mut conn = PgConnection::connect(&url).await?;
            MIGRATOR.run(&mut conn).await.map_err(sqlx::Error::from)?;
            let mut count = 0;
            for statement in super::super::postgres_pipeline::every_statement() {
                conn.prepare(sqlx::SqlSafeStr::into_sql_str(statement))
                    .await?;
                count += 1;
            }
            conn.close().await?;
            Ok::<_, sqlx::Error>(count)
        }
        .await;
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE {name} WITH (FORCE)"
            )))
            .await
            .expect("the test's database dropped");
        assert_eq!(prepared.expect("every shape prepares"), 2 * 32 * 16);
    }
}
