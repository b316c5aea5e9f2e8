//! Storage: one trait per aggregate, two real backends (SQLite embedded, PostgreSQL shared).
//!
//! Both use the database's own uniqueness check to decide races: a claim is an
//! `INSERT … ON CONFLICT DO NOTHING RETURNING`, a takeover one compare-and-set `UPDATE` on the
//! state and lock token it read. Times are unix milliseconds; identifiers only ever arrive here
//! as keyed digests.
//!
//! Each aggregate file holds its types, its trait and its SQL, written once for both backends
//! as an ordinary generic impl over [`backend::Backend`] (its pools, how it begins, the few
//! statements and settings that differ by dialect, which each backend's file states once).
//! Generic code rather than the macros it replaces: go-to-definition lands on the code, a
//! compile error points at it, and nothing depends on names at an expansion site or on the
//! order of declarations here. The price is the list of sqlx bounds (what a statement binds
//! and decodes, that a connection executes) that each generic impl states, the same list
//! each time, since Rust does not imply a trait's where-clauses; the sealed
//! [`backend::SqlDb`] keeps it to SQLite and PostgreSQL, and its methods supply what generic
//! sqlx cannot name (rows changed).
//! - [`tenants`]: tenants, their rate limits and sealed secrets;
//! - [`api_keys`]: tenants' API keys and their scopes;
//! - [`connectors`]: tenants' connectors (their own systems that actions call);
//! - [`endpoints`]: tenants' callback endpoints, their filters and sealed secrets;
//! - [`keys`]: idempotency keys and the state table's judgement;
//! - [`playbooks`]: playbook versions and what a decision reads;
//! - [`actions`]: the idempotent effects (locks, cases, alert windows, ledger, denies);
//! - [`events`]: decided signals;
//! - [`deliveries`]: the callback outbox and its attempts;
//! - [`pipeline`]: the group commit that writes a batch of signals' claims and effects at once;
//! - [`activity`]: the console's reads (filtered events, live numbers, playbook history);
//! - [`console_sessions`]: the console's sign-in sessions (stored hashed, tied to their key);
//! - [`operator`]: an operator's way back (unlock, lift a deny, close a case);
//! - [`feeds`]: SET transmitters and CAMARA subscriptions of the standard feeds;
//! - [`sweep`]: where the pruner's sweep has got to.

pub mod actions;
pub mod activity;
pub mod api_keys;
pub mod connectors;
pub mod console_sessions;
pub mod deliveries;
pub mod endpoints;
pub mod events;
/// Test hooks: named points where tests stop a request (compiled in with `failpoints`).
pub(crate) mod failpoint;
pub mod feeds;
pub mod keys;
pub(crate) mod lists;
pub mod operator;
pub mod pipeline;
pub mod playbooks;
pub mod ports;
pub(crate) mod rows;
pub mod sweep;
pub mod tenants;
pub mod usage;

pub(crate) mod backend;

use std::sync::Arc;

use async_trait::async_trait;
use backend::{Backend, SqlDb};
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

pub use actions::{ActionStore, ActionTarget, SubjectState};
pub use activity::{Activity, ActivityStore, EventFilter, MinuteCount, PlaybookVersion};
pub use api_keys::{ApiKeyRecord, ApiKeyStore, KeyGrant, NewApiKey, Scope, UnknownScope};
pub use connectors::{ConnectorRecord, ConnectorStore, PutConnector};
pub use console_sessions::{ConsoleSession, ConsoleSessionStore, NewConsoleSession};
pub use deliveries::{
    AttemptRecord, AttemptRow, DeliveryRecord, DeliveryStore, DueDelivery, NewDelivery, Redelivery,
    Resolution, Resolved,
};
pub use endpoints::{EndpointRecord, EndpointStore, PutEndpoint};
pub use events::{EventRecord, EventStore, NewEvent, PrunedEvents};
pub use feeds::{FeedStore, TransmitterRecord};
pub use keys::{
    Claim, ClaimOutcome, KeyRef, KeyState, KeyStore, PrunedKeys, RecoveryPoint, StoredResponse,
    judge,
};
pub use operator::{KeyedUndo, OperatorStore, Undo};
pub use pipeline::{
    Act, ActOutcome, Batch, BatchResult, CallbackDraft, CallsDone, Committed, EnvelopeBytes,
    Expected, Finished, HeldKey, PipelineStore, Render, RequestDraft,
};
pub use playbooks::{DecisionInputs, EndpointTarget, PlaybookStore, StoredPlaybook};
pub use sweep::{SweepPosition, SweepStore};
pub use tenants::{NewTenant, SealedSecret, SecretPurpose, TenantRecord, TenantStore};

/// The store's limits, which the callers above it size their work by.
///
/// Most signals' work in one group commit ([`PipelineStore`]): the pipeline's statements are
/// prepared in one shape per batch size up to this.
pub const MAX_BATCH: usize = 64;
/// Decision readers running at once: each holds a connection of the pipeline pool.
pub const DECISION_READERS: usize = 2;

/// Errors from storage; `is_transient` tells a retry from a final failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the database is unreachable or busy")]
    Unavailable(#[source] sqlx::Error),
    #[error("another request took over this idempotency key")]
    LockLost,
    #[error("database error")]
    Database(#[source] sqlx::Error),
    #[error("migrations failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored value that does not decode; the cause says which and why.
    #[error("a stored record is malformed")]
    Corrupt(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("unsupported database URL (expected sqlite://PATH or postgres://…)")]
    UnsupportedUrl,
    /// A failure of a whole group commit, reported to each request in it.
    #[error("the group commit failed")]
    Batch(#[source] Arc<StoreError>),
    /// The database did not answer a statement on a request's path within its deadline
    /// ([`answered_within`]): the connection may have gone silent (a network partition, a
    /// host that stopped without closing it). What was sent may still commit, so this is as
    /// ambiguous as a connection lost mid-statement, and as transient.
    #[error("the database did not answer within {0:?}")]
    Unanswered(std::time::Duration),
}

impl StoreError {
    /// A transient failure leaves work at its last recovery point for a retry to resume.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Unavailable(_) | Self::LockLost | Self::Unanswered(_) => true,
            Self::Batch(inner) => inner.is_transient(),
            _ => false,
        }
    }
}

impl StoreError {
    /// Whether the database rolled the whole transaction back to break a deadlock or a
    /// serialization conflict with a concurrent one (PostgreSQL 40P01, 40001): nothing of it
    /// was stored, and running it again is the documented remedy.
    pub fn is_conflict(&self) -> bool {
        match self {
            Self::Unavailable(sqlx::Error::Database(db)) => db
                .code()
                .is_some_and(|code| matches!(&*code, "40001" | "40P01")),
            Self::Batch(inner) => inner.is_conflict(),
            _ => false,
        }
    }

    /// Whether the database could not be reached at all (no connection within the timeout, or
    /// the server going away), rather than a statement that may simply succeed when run again:
    /// work queued behind such a failure meets the same outage.
    pub fn is_unreachable(&self) -> bool {
        use sqlx::Error as E;
        match self {
            Self::Unavailable(err) => match err {
                E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
                E::Database(db) => db
                    .code()
                    .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
                _ => false,
            },
            // Work queued behind a silent connection would wait out a deadline of its own.
            Self::Unanswered(_) => true,
            Self::Batch(inner) => inner.is_unreachable(),
            _ => false,
        }
    }
}

/// Runs `work` (database calls on a request's path), failing it as
/// [`StoreError::Unanswered`] once `deadline` has passed; `None` waits as long as it takes.
///
/// Nothing else bounds a connection that goes silent without closing: sqlx has no read
/// timeout, TCP keepalives are not set on its sockets (and a peer's kernel that still
/// acknowledges would answer them anyway), and a server-side `statement_timeout` cannot
/// reach the client across the same silence. Dropping `work` drops its connection mid-use;
/// the pool tests it before reuse (sqlx pings every returned connection), so it is reused only
/// once the database answers it again.
pub(crate) async fn answered_within<T, E>(
    deadline: Option<std::time::Duration>,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, StoreError>
where
    StoreError: From<E>,
{
    let Some(deadline) = deadline else {
        return Ok(work.await?);
    };
    match tokio::time::timeout(deadline, work).await {
        Ok(done) => Ok(done?),
        Err(_) => Err(StoreError::Unanswered(deadline)),
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &err {
            E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
                Self::Unavailable(err)
            }
            E::Database(db) if transient_database_error(db.as_ref()) => Self::Unavailable(err),
            _ => Self::Database(err),
        }
    }
}

/// Whether the database refused for a reason that may pass, so the same statement may well
/// succeed on retry and the work must stay at its recovery point rather than end in a stored
/// 500. SQLite: busy or locked, an I/O error, a full disk (primary result codes 5, 6, 10, 13,
/// whatever their extended code). PostgreSQL: serialization failure, deadlock, shutdown, the
/// connection exception class (08) and the insufficient resources class (53: disk full, out of
/// memory, too many connections).
fn transient_database_error(db: &dyn sqlx::error::DatabaseError) -> bool {
    let Some(code) = db.code() else {
        return false;
    };
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        let primary = code.parse::<i32>().map_or(-1, |extended| extended & 0xff);
        return matches!(primary, 5 | 6 | 10 | 13);
    }
    // Serialization, deadlock, shutdown; a write refused by a host that is (now) a read-only
    // standby; connection (08) and resource (53: disk full, memory, too many connections).
    matches!(
        &*code,
        "40001" | "40P01" | "57P01" | "57P02" | "57P03" | "25006"
    ) || code.starts_with("08")
        || code.starts_with("53")
}

/// Everything verdict stores, whichever database holds it: the sum of the aggregates.
///
/// The consumers' ports ([`ports`]) are named here too, so the composition root's
/// `Arc<dyn Store>` upcasts to each.
#[async_trait]
pub trait Store:
    TenantStore
    + ApiKeyStore
    + ConnectorStore
    + EndpointStore
    + OperatorStore
    + KeyStore
    + PlaybookStore
    + ActionStore
    + EventStore
    + DeliveryStore
    + PipelineStore
    + FeedStore
    + ActivityStore
    + ConsoleSessionStore
    + usage::UsageStore
    + ports::TenantPort
    + ports::DeliveryPort
    + ports::FeedPort
    + ports::IngestStore
    + ports::RetentionStore
    + ports::ConsoleStore
    + ports::ConnectorPort
    + ports::EndpointPort
    + ports::PlaybookPort
    + ports::SubjectPort
    + Send
    + Sync
    + 'static
{
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// One round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;
    /// The database's master-key sentinel, if one is stored yet.
    async fn stored_sentinel(&self) -> Result<Option<Vec<u8>>, StoreError>;
    /// The database's master-key sentinel: `fresh` stored (at `now`) if the database has none
    /// yet, else the one stored first.
    async fn master_key_sentinel(&self, fresh: &[u8], now: i64) -> Result<Vec<u8>, StoreError>;
    /// The oldest sealed tenant secret with its tenant, if any: what a key is checked against
    /// on a database set up before sentinels existed, before its first sentinel is stored.
    async fn oldest_sealed_secret(&self) -> Result<Option<(Uuid, SealedSecret)>, StoreError>;
    /// How many group commits may run at once: one on SQLite (one writer), several on
    /// PostgreSQL.
    fn concurrent_commits(&self) -> usize;
    /// How long an idle committer waits for the requests on their way, if it does.
    fn commit_gathering(&self) -> Option<std::time::Duration>;
}

/// Opens the backend a URL names and runs its migrations.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = if url.starts_with("sqlite:") {
        Arc::new(SqliteStore::connect(url).await?)
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Arc::new(PostgresStore::connect(url).await?)
    } else {
        return Err(StoreError::UnsupportedUrl);
    };
    store.migrate().await?;
    Ok(store)
}

/// The file a `sqlite:` URL points at, if any (for placing the master key beside it).
pub fn sqlite_path(url: &str) -> Option<std::path::PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| path.into())
}

/// The shared parts of [`Store`], for every backend.
#[async_trait]
impl<B: Backend<Db = DB> + PipelineStore, DB: SqlDb> Store for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    async fn migrate(&self) -> Result<(), StoreError> {
        self.migrate_schema().await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        answered_within(
            B::ANSWER_DEADLINE,
            sqlx::query("SELECT 1").execute(self.read()),
        )
        .await?;
        Ok(())
    }

    async fn stored_sentinel(&self) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT sealed FROM master_key_sentinel WHERE id = 1")
                .fetch_optional(self.write())
                .await?,
        )
    }

    async fn oldest_sealed_secret(&self) -> Result<Option<(Uuid, SealedSecret)>, StoreError> {
        let row: Option<(Uuid, Uuid, String, Vec<u8>, i64, Option<i64>)> = sqlx::query_as(
            "SELECT tenant_id, id, purpose, sealed, created_at, retired_at FROM tenant_secrets \
             ORDER BY created_at, id LIMIT 1",
        )
        .fetch_optional(self.write())
        .await?;
        row.map(|(tenant_id, id, purpose, sealed, created_at, retired_at)| {
            Ok((
                tenant_id,
                SealedSecret {
                    id,
                    purpose: purpose
                        .parse()
                        .map_err(|e| StoreError::Corrupt(Box::new(e)))?,
                    sealed,
                    created_at,
                    retired_at,
                },
            ))
        })
        .transpose()
    }

    async fn master_key_sentinel(&self, fresh: &[u8], now: i64) -> Result<Vec<u8>, StoreError> {
        sqlx::query(
            "INSERT INTO master_key_sentinel (id, sealed, created_at) VALUES (1, $1, $2) \
             ON CONFLICT (id) DO NOTHING",
        )
        .bind(fresh)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(
            sqlx::query_scalar("SELECT sealed FROM master_key_sentinel WHERE id = 1")
                .fetch_one(self.write())
                .await?,
        )
    }

    fn concurrent_commits(&self) -> usize {
        B::COMMITS
    }

    fn commit_gathering(&self) -> Option<std::time::Duration> {
        B::GATHER
    }
}

/// Aborts a store's background task (a host follower, a checkpointer) when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

mod postgres;
mod postgres_clock;
mod postgres_hosts;
mod postgres_pipeline;
mod sqlite;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement on a silent connection never answers; the request must not wait on it,
    /// and its failure is a 503 (transient) that fails what queued behind it (unreachable).
    #[tokio::test]
    async fn a_call_unanswered_by_its_deadline_fails_as_transient_and_unreachable() {
        let deadline = std::time::Duration::from_millis(50);
        let silent = std::future::pending::<Result<(), sqlx::Error>>();
        let err = answered_within(Some(deadline), silent)
            .await
            .expect_err("a silent database is given up on");
        assert!(
            matches!(err, StoreError::Unanswered(d) if d == deadline),
            "{err:?}"
        );
        assert!(err.is_transient() && err.is_unreachable(), "{err:?}");
        let answered = answered_within(Some(deadline), async { Ok::<_, sqlx::Error>(7) }).await;
        assert_eq!(answered.unwrap(), 7);
    }

    /// A full SQLite database (here: one page allowed) leaves work at its recovery point, as a
    /// full disk must: a moment of it during a fuzzing run stored a 500 on the key it hit.
    #[tokio::test]
    async fn a_full_sqlite_database_is_transient() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (v BLOB)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("PRAGMA max_page_count = 2")
            .execute(&pool)
            .await
            .unwrap();
        let err = sqlx::query("INSERT INTO t VALUES (zeroblob(100000))")
            .execute(&pool)
            .await
            .expect_err("the database is full");
        assert!(err.to_string().contains("full"), "{err}");
        let err = StoreError::from(err);
        assert!(err.is_transient(), "{err:?}");
    }

    #[tokio::test]
    async fn a_constraint_violation_is_final() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        sqlx::query("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .execute(&pool)
            .await
            .unwrap();
        let insert = || sqlx::query("INSERT INTO t VALUES (1)").execute(&pool);
        insert().await.unwrap();
        let err = StoreError::from(insert().await.expect_err("a duplicate"));
        assert!(!err.is_transient(), "{err:?}");
    }

    #[test]
    fn no_connection_is_transient_and_unreachable() {
        for err in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()),
            sqlx::Error::Io(std::io::ErrorKind::UnexpectedEof.into()),
        ] {
            let err = StoreError::from(err);
            assert!(err.is_transient() && err.is_unreachable(), "{err:?}");
            let batch = StoreError::Batch(std::sync::Arc::new(err));
            assert!(batch.is_transient() && batch.is_unreachable());
        }
    }

    #[test]
    fn a_lost_lock_is_transient_but_not_an_outage() {
        assert!(StoreError::LockLost.is_transient());
        assert!(!StoreError::LockLost.is_unreachable());
    }

    #[test]
    fn a_malformed_record_is_final() {
        let err = StoreError::Corrupt("bad".into());
        assert!(!err.is_transient() && !err.is_unreachable());
        let err = StoreError::from(sqlx::Error::RowNotFound);
        assert!(!err.is_transient() && !err.is_unreachable());
    }
}
