//! What the shared SQL needs of a backend: its pools, how it begins a transaction, and the few
//! statements and settings that differ by dialect. The aggregates implement their traits once,
//! for every `B: Backend` whose database is one of ours ([`SqlDb`]).

use std::future::Future;

use sqlx::{Database, Pool, Transaction};

/// A backend: SQLite ([`super::SqliteStore`]) or PostgreSQL ([`super::PostgresStore`]).
pub(crate) trait Backend: Send + Sync + 'static {
    /// Its database.
    type Db: SqlDb;
    /// The pool reads go through.
    fn read(&self) -> &Pool<Self::Db>;
    /// The pool every write goes through.
    fn write(&self) -> &Pool<Self::Db>;
    /// Begins a write transaction.
    fn begin(
        &self,
    ) -> impl Future<Output = Result<Transaction<'static, Self::Db>, sqlx::Error>> + Send;
    /// How a read that must see one snapshot begins.
    const READ_SNAPSHOT: &'static str;
    /// Whether a query may hold several statements.
    const MULTI_STATEMENT: bool;
    /// Leases due deliveries (the dialects differ in how they take rows atomically).
    const LEASE_DUE: &'static str;
    /// How many group commits may run at once.
    const COMMITS: usize;
    /// The backend's migrations.
    fn migrator() -> &'static sqlx::migrate::Migrator;
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
/// states them: see the `where` list on the aggregates' impls, the same in each.
pub(crate) trait SqlDb: Database + sealed::Sealed + super::actions::KeyList {
    /// Rows a statement changed.
    fn rows_affected(done: &Self::QueryResult) -> u64;
}

impl SqlDb for sqlx::Sqlite {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}

impl SqlDb for sqlx::Postgres {
    fn rows_affected(done: &Self::QueryResult) -> u64 {
        done.rows_affected()
    }
}
