//! What the shared SQL needs of a backend: its pools, how it begins a transaction, and the few
//! statements and settings that differ by dialect. The aggregates implement their traits once,
//! for every `B: Backend` whose database is one of ours ([`SqlDb`]).

use std::future::Future;

use sqlx::{Connection, Database, Executor, IntoArguments, Pool, QueryBuilder, Transaction};

/// A backend: SQLite ([`super::SqliteStore`]) or PostgreSQL ([`super::PostgresStore`]).
pub(crate) trait Backend: Send + Sync + 'static {
    /// Its database.
    type Db: SqlDb;
    /// The pool reads go through.
    fn read(&self) -> &Pool<Self::Db>;
    /// The pool every write goes through.
    fn write(&self) -> &Pool<Self::Db>;
    /// The pool the decision reads go through.
    fn decisions(&self) -> &Pool<Self::Db>;
    /// Begins a write transaction.
    fn begin(
        &self,
    ) -> impl Future<Output = Result<Transaction<'static, Self::Db>, sqlx::Error>> + Send;
    /// Begins a write transaction whose statements are each planned once for any parameters,
    /// in the same round trip as its `BEGIN`; [`Self::begin`] where planning never reads the
    /// tables.
    ///
    /// PostgreSQL plans a statement again for its parameters, and a bound near either end of
    /// an index's range makes it read the index's end for the actual value there
    /// (`get_actual_variable_range`), walking every dead entry on the way. Where rows go oldest
    /// first, those are all the rows deleted since the last vacuum.
    fn begin_generic(
        &self,
    ) -> impl Future<Output = Result<Transaction<'static, Self::Db>, sqlx::Error>> + Send;
    /// How a read that must see one snapshot begins.
    const READ_SNAPSHOT: &'static str;
    /// Makes other write transactions that run it for the same tenant (bound as `$1`) wait
    /// for this one to end, so that a count checked before an insert cannot miss what another
    /// inserts; `None` where every write transaction already waits for the others.
    const LOCK_TENANT: Option<&'static str>;
    /// Leases due deliveries, returning [`super::deliveries::DUE_COLUMNS`] (the dialects
    /// differ in how they take rows atomically).
    fn lease_due() -> &'static str;
    /// How many group commits may run at once.
    const COMMITS: usize;
    /// How long a committer that found nothing queued waits for the requests on their way
    /// (`ingest::group_commit`); `None`: it takes what is queued and goes.
    const GATHER: Option<std::time::Duration>;
    /// The longest a request waits for one database call on its path (a connection and a
    /// statement) before answering 503 ([`super::answered_within`]); `None` where the
    /// database cannot go silent.
    const ANSWER_DEADLINE: Option<std::time::Duration>;
    /// Applies the backend's pending migrations.
    fn migrate_schema(
        &self,
    ) -> impl Future<Output = Result<(), sqlx::migrate::MigrateError>> + Send;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for sqlx::Sqlite {}
    impl Sealed for sqlx::Postgres {}
}

/// One of our two databases, with what generic sqlx code cannot name for either.
///
/// The bounds the shared code needs of a database (which types it binds and decodes, that a
/// connection executes) are not implied by a trait's where-clauses, so each generic impl block
/// states them: see the `where` list on the aggregates' impls, the same in each. Each backend's
/// file implements it for its database.
pub(crate) trait SqlDb: Database + sealed::Sealed + super::lists::Lists {
    /// Whether a query may hold several statements.
    const MULTI_STATEMENT: bool;
    /// Rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
    /// The column that addresses a row physically: `ctid` on PostgreSQL, `rowid` on SQLite.
    const ROW_ADDRESS: &'static str;
    /// A condition that holds for the rows whose addresses `subquery` selects, found by address
    /// (a TID scan on PostgreSQL) rather than by a key's index.
    fn address_in(subquery: &str) -> String;
    /// What a `SELECT` ends with to lock the rows it reads against a concurrent update until
    /// the transaction ends, so that it reads their latest version (PostgreSQL's
    /// `FOR SHARE`); nothing on SQLite, whose one writer already serializes it.
    const SHARE_ROWS: &'static str;
    /// A query for the ids of the events of tenant `$1` about subject `$2`, in no order: on
    /// PostgreSQL one probe of `events_by_subject` for each day the tenant has events on.
    const SUBJECT_EVENT_IDS: &'static str;
}

/// Runs what `q` holds, if anything, and empties it for the next statements.
pub(crate) async fn execute_pushed<DB, C>(
    conn: &mut C,
    q: &mut QueryBuilder<DB>,
) -> Result<(), sqlx::Error>
where
    DB: Database<Connection = C>,
    C: Connection<Database = DB>,
    for<'c> &'c mut C: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    if !q.sql().as_str().is_empty() {
        q.build().execute(&mut *conn).await?;
        q.reset();
    }
    Ok(())
}
