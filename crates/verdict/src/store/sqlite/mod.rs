//! The embedded backend: one SQLite file in WAL mode.
//!
//! SQLite has one writer at a time, so writes go through a one-connection pool (queueing in
//! the pool instead of busy-waiting between our own connections) and reads through a small
//! pool beside it. Write transactions start with `BEGIN IMMEDIATE` so they take the write lock
//! up front instead of failing to upgrade a read lock half-way.
//!
//! Checkpoints (copying the WAL back into the database file, then an fsync) run on a
//! connection of their own, off the writer: left to SQLite, the commit that crosses the
//! auto-checkpoint threshold does it, and every write queued behind that commit waits for it.
//! The checkpointer also makes the log start over once it passes a bound, and rests while
//! nothing is written.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};

use super::{AbortOnDrop, StoreError};

mod effects;
mod pipeline;
mod subjects;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// SQLite-backed storage.
#[derive(Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    /// The background checkpointer ([`checkpoint_every`]); stops with the last clone.
    _checkpoints: Arc<AbortOnDrop>,
    /// Checkpoints the checkpointer has started and finished.
    #[cfg_attr(not(test), allow(dead_code))]
    checkpoint_counts: Arc<CheckpointCounts>,
}

/// How many checkpoints the checkpointer has started and finished (tests read them).
#[derive(Default)]
struct CheckpointCounts {
    started: AtomicU64,
    finished: AtomicU64,
}

/// How often the checkpointer copies what the WAL holds into the database file. Whatever
/// restarts the log copies what the last of these left behind while every write waits, so
/// this interval bounds that stall. At 100 ms it took 25–60 ms and set p99 (3–4 × p50 at
/// c=32); at 25 ms p99 is 1.5–2 × p50 for about 3% of throughput.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(25);

/// How long the checkpointer rests at most while nothing is counted written: a write the count
/// misses (a writer connection closed instead of released, another process's write) is copied
/// within this.
const RESTING_CHECK: Duration = Duration::from_secs(1);

/// WAL pages past which the checkpointer makes the log start over (about 40 MiB): the WAL's
/// bound. SQLite resets the log only when a write begins with every frame copied and no
/// reader on an older snapshot, which a PASSIVE checkpoint never leaves behind under
/// sustained writes (frames are always committed behind it), so past this the checkpointer
/// runs a RESTART one between two group commits (see [`checkpoint`]).
const RESTART_AT_PAGES: i64 = 10_000;

/// How long a connection waits for a lock another one holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the RESTART checkpoint waits for readers on older snapshots, holding up the group
/// commits meanwhile: a long read (a console listing) delays the restart to a later tick
/// instead of every write.
const RESTART_WAIT: Duration = Duration::from_millis(50);

/// How long the checkpointer leaves the log alone after readers kept a RESTART from
/// finishing: a long read costs the writes at most one [`RESTART_WAIT`] per this.
const RESTART_BACKOFF: Duration = Duration::from_secs(1);

/// WAL pages at which the writer checkpoints on its own after a commit: a backstop should
/// the checkpointer stop, twice [`RESTART_AT_PAGES`] so that it normally never runs. It
/// cannot be the bound itself: SQLite skips it whenever the checkpointer is mid-run, which on
/// a busy machine was nearly always (the WAL reached 29,860 pages with it at 10,000).
const WRITER_CHECKPOINT_PAGES: &str = "20000";

impl SqliteStore {
    /// Opens (creating if missing) the database file a `sqlite:` URL names.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // The group commit's multi-row statements differ by row count: keep every shape
        // prepared instead of re-preparing them as they evict each other.
        let options = SqliteConnectOptions::from_str(url)?
            .statement_cache_capacity(super::pipeline::STATEMENT_SHAPES)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a committed claim or completion survives power loss, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // A statement inside the group commit's transaction journals the pages it
            // changes, so that it can be undone alone; in memory, not in a temporary file.
            .pragma("temp_store", "memory");
        // Each time the writer's connection comes back, the log may have grown: the
        // checkpointer skips its ticks while this stays where it was when the log was last
        // found copied whole.
        let writes = Arc::new(AtomicU64::new(0));
        let released = Arc::clone(&writes);
        // A pool pings each connection it hands out unless told otherwise: a thread hop per
        // group commit. An SQLite connection is a file handle in this process and cannot
        // break while idle, so the ping checks nothing.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            // A connection past its lifetime is closed as it comes back, before the release
            // is counted; a file handle in this process gains nothing from being replaced.
            .max_lifetime(None)
            .after_release(move |_, _| {
                released.fetch_add(1, Ordering::Relaxed);
                Box::pin(async { Ok(true) })
            })
            .connect_with(
                options
                    .clone()
                    .pragma("wal_autocheckpoint", WRITER_CHECKPOINT_PAGES),
            )
            .await?;
        let checkpoint_counts = Arc::new(CheckpointCounts::default());
        let checkpoints = checkpoint_every(
            SqlitePoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect_with(options.clone())
                .await?,
            writer.clone(),
            writes,
            Arc::clone(&checkpoint_counts),
        );
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.read_only(true))
            .await?;
        Ok(Self {
            writer,
            reader,
            _checkpoints: Arc::new(AbortOnDrop(checkpoints)),
            checkpoint_counts,
        })
    }

    /// The pool every write goes through.
    pub fn write(&self) -> &SqlitePool {
        &self.writer
    }

    /// The pool reads go through.
    pub fn read(&self) -> &SqlitePool {
        &self.reader
    }

    /// The pool the decision reads go through: the readers'.
    pub fn decisions(&self) -> &SqlitePool {
        &self.reader
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        match self.writer.begin_with("BEGIN IMMEDIATE").await {
            // SQLite ends a transaction on its own after some failures (a full disk, an I/O
            // error), and sqlx's count of open transactions on the connection then stays one
            // too high: every later `BEGIN` on it is refused as a savepoint statement, for
            // good. The writer's one connection is closed (the pool opens a fresh one) and the
            // transaction begun again once. Found by `faults_disk`.
            Err(sqlx::Error::InvalidSavePointStatement) => {
                tracing::warn!(
                    "the SQLite writer connection lost its transaction state; reopening it"
                );
                self.writer.acquire().await?.close().await?;
                self.writer.begin_with("BEGIN IMMEDIATE").await
            }
            begun => begun,
        }
    }
}

/// How a read that must see one snapshot begins (a read transaction in WAL mode keeps one snapshot until it ends).
const READ_SNAPSHOT: &str = "BEGIN";

/// Leases due deliveries; SQLite's single writer makes the `UPDATE` atomic across workers.
static LEASE_DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE deliveries SET leased_until = $2 WHERE id IN ( \
         SELECT d.id FROM delivery_queue q JOIN deliveries d ON d.id = q.id \
         JOIN tenants t ON t.id = d.tenant_id \
         WHERE q.next_attempt_at <= $1 AND d.status = 'pending' \
         AND d.next_attempt_at = q.next_attempt_at AND d.leased_until <= $1 \
         AND d.updated_at < $4 AND d.retries_left > 0 \
         AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id AND e.disabled) \
         AND lower(hex(d.tenant_id)) NOT IN (SELECT replace(value, '-', '') FROM json_each($5)) \
         ORDER BY q.next_attempt_at LIMIT $3) \
         RETURNING {}",
        super::deliveries::DUE_COLUMNS
    )
});

impl super::backend::SqlDb for Sqlite {
    /// SQLite runs several statements of a query in turn, in one hop to its connection thread.
    const MULTI_STATEMENT: bool = true;

    fn rows_affected(done: &sqlx::sqlite::SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    const ROW_ADDRESS: &'static str = "rowid";

    fn address_in(subquery: &str) -> String {
        format!("rowid IN ({subquery})")
    }

    const SHARE_ROWS: &'static str = "";

    const SUBJECT_EVENT_IDS: &'static str =
        "SELECT id FROM events WHERE tenant_id = $1 AND subject_hash = $2";
}

impl super::backend::Backend for SqliteStore {
    type Db = Sqlite;

    fn read(&self) -> &SqlitePool {
        &self.reader
    }

    fn write(&self) -> &SqlitePool {
        &self.writer
    }

    fn decisions(&self) -> &SqlitePool {
        &self.reader
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        SqliteStore::begin(self).await
    }

    async fn begin_generic(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        SqliteStore::begin(self).await
    }

    const READ_SNAPSHOT: &'static str = READ_SNAPSHOT;
    /// A write transaction begins `IMMEDIATE`, holding the database's one write lock.
    const LOCK_TENANT: Option<&'static str> = None;
    fn lease_due() -> &'static str {
        &LEASE_DUE
    }
    const COMMITS: usize = 1;
    /// A commit costs little more than a statement, and the one writer would idle while
    /// it waits: throughput and CPU per signal were worse with a 2 ms gathering.
    const GATHER: Option<std::time::Duration> = None;
    /// A local file: a statement is slow, never unanswered.
    const ANSWER_DEADLINE: Option<std::time::Duration> = None;

    async fn migrate_schema(&self) -> Result<(), sqlx::migrate::MigrateError> {
        MIGRATOR.run(&self.writer).await
    }
}

/// Runs [`checkpoint`] every [`CHECKPOINT_EVERY`] on `pool`'s connection, except while
/// `writes` (the writer connection's releases) stays where it was when a checkpoint last found
/// the log copied whole: an idle server checkpoints once every [`RESTING_CHECK`]. Counts the
/// checkpoints in `counts`.
fn checkpoint_every(
    pool: SqlitePool,
    writer: SqlitePool,
    writes: Arc<AtomicU64>,
    counts: Arc<CheckpointCounts>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(CHECKPOINT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        let mut restart_after = tokio::time::Instant::now();
        let mut copied_at = None;
        let mut last_run = tokio::time::Instant::now();
        loop {
            every.tick().await;
            // Read before the checkpoint: a write it misses is released after this.
            let written = writes.load(Ordering::Relaxed);
            if copied_at == Some(written) && last_run.elapsed() < RESTING_CHECK {
                continue;
            }
            last_run = tokio::time::Instant::now();
            let may_restart = tokio::time::Instant::now() >= restart_after;
            counts.started.fetch_add(1, Ordering::Relaxed);
            let done = checkpoint(&pool, &writer, may_restart).await;
            counts.finished.fetch_add(1, Ordering::Relaxed);
            match done {
                Ok(restart) => {
                    failing = false;
                    copied_at = match restart {
                        Restart::AllCopied => Some(written),
                        // The restart took the writer's connection once (one release); any
                        // other write since makes the next tick run.
                        Restart::Done => Some(written + 1),
                        Restart::NotDue | Restart::ReadersInTheWay => None,
                    };
                    if restart == Restart::ReadersInTheWay {
                        restart_after = tokio::time::Instant::now() + RESTART_BACKOFF;
                    }
                }
                // Once per run of failures, not on every tick; the writer's own threshold
                // still bounds the WAL meanwhile.
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(error = ?err, "background WAL checkpoints are failing");
                }
                Err(_) => {}
            }
        }
    })
}

/// What a checkpoint did about starting the log over.
#[derive(Debug, PartialEq, Eq)]
enum Restart {
    /// Every frame of a log below [`RESTART_AT_PAGES`] is in the database file: nothing to do
    /// until the next write.
    AllCopied,
    /// The log is below [`RESTART_AT_PAGES`], or a restart may not be tried yet.
    NotDue,
    /// The next write starts the log over.
    Done,
    /// Readers on older snapshots outlasted [`RESTART_WAIT`].
    ReadersInTheWay,
}

/// A PASSIVE checkpoint on `pool`, which copies the frames no reader still needs and blocks
/// no one; then, if the log has grown past [`RESTART_AT_PAGES`] and `may_restart`, a RESTART
/// one on the writer's connection, taken in turn with the group commits: it copies the few
/// frames committed meanwhile, waits (at most [`RESTART_WAIT`]) only for readers on older
/// snapshots, and lets the next write start the log over. (From a connection of its own it
/// waits for the write lock, which a busy writer takes again first: it was seen to wait 400 ms
/// while the log doubled.)
async fn checkpoint(
    pool: &SqlitePool,
    writer: &SqlitePool,
    may_restart: bool,
) -> Result<Restart, sqlx::Error> {
    // (busy, frames in the log, frames copied)
    let (busy, log, copied): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)")
        .fetch_one(pool)
        .await?;
    // A long log copied whole still restarts: under sustained writes the next write often
    // began before this checkpoint ended, and the log kept growing (to 20,250 frames).
    // (1, -1, -1) while another connection checkpoints: nothing is known copied.
    if busy == 0 && log >= 0 && log == copied && log < RESTART_AT_PAGES {
        return Ok(Restart::AllCopied);
    }
    if log < RESTART_AT_PAGES || !may_restart {
        return Ok(Restart::NotDue);
    }
    let mut conn = writer.acquire().await?;
    // Built from our own constants, not from input.
    let busy_timeout =
        |wait: Duration| sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {}", wait.as_millis()));
    sqlx::raw_sql(busy_timeout(RESTART_WAIT))
        .execute(&mut *conn)
        .await?;
    let restarted: Result<(i64, i64, i64), _> = sqlx::query_as("PRAGMA wal_checkpoint(RESTART)")
        .fetch_one(&mut *conn)
        .await;
    sqlx::raw_sql(busy_timeout(BUSY_TIMEOUT))
        .execute(&mut *conn)
        .await?;
    Ok(match restarted? {
        (0, _, _) => Restart::Done,
        _ => Restart::ReadersInTheWay,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store on a new file in a scratch directory, with one table `t (x BLOB)`.
    async fn scratch_store() -> (std::path::PathBuf, std::path::PathBuf, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("verdict-wal-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let path = dir.join("v.db");
        let store = SqliteStore::connect(&format!("sqlite://{}", path.display()))
            .await
            .expect("opens");
        sqlx::query("CREATE TABLE t (x BLOB)")
            .execute(store.write())
            .await
            .expect("creates");
        (dir, path, store)
    }

    /// Checkpoints the checkpointer has started.
    fn checkpoints_started(store: &SqliteStore) -> u64 {
        store.checkpoint_counts.started.load(Ordering::Relaxed)
    }

    /// Waits (at most 10 s) until the checkpointer has finished every checkpoint it started
    /// and started none for 4 ticks, and returns how many it started until then. A fixed wait
    /// was not enough: on a busy machine the copy of a long log outlasted it, and the
    /// checkpoints after it fell into the idle ticks a test counts.
    async fn checkpoints_settled(store: &SqliteStore) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let mut count = checkpoints_started(store);
        let mut quiet = 0;
        while quiet < 4 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(CHECKPOINT_EVERY).await;
            let now = checkpoints_started(store);
            let running = now != store.checkpoint_counts.finished.load(Ordering::Relaxed);
            quiet = if now == count && !running {
                quiet + 1
            } else {
                0
            };
            count = now;
        }
        count
    }

    #[tokio::test]
    async fn the_wal_is_copied_into_the_database_file_without_waiting_for_the_writer() {
        let (dir, path, store) = scratch_store().await;
        let before = std::fs::metadata(&path).expect("the file").len();
        // About 100 pages: far below both SQLite's default auto-checkpoint (1,000 pages) and
        // the writer's threshold here, so only the background checkpointer copies them.
        for _ in 0..100 {
            sqlx::query("INSERT INTO t VALUES (zeroblob(4000))")
                .execute(store.write())
                .await
                .expect("inserts");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut size = before;
        while size < before + 100 * 4000 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            size = std::fs::metadata(&path).expect("the file").len();
        }
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            size >= before + 100 * 4000,
            "the database file stayed at {size} bytes (from {before})"
        );
    }

    #[tokio::test]
    async fn an_idle_store_runs_no_checkpoints_until_the_next_write() {
        let (dir, path, store) = scratch_store().await;
        sqlx::query("INSERT INTO t VALUES (zeroblob(4000))")
            .execute(store.write())
            .await
            .expect("inserts");
        // One checkpoint copies the write and finds the log whole; the ticks after it skip.
        let settled = checkpoints_settled(&store).await;
        tokio::time::sleep(CHECKPOINT_EVERY * 12).await;
        let idle = checkpoints_started(&store) - settled;
        let before = std::fs::metadata(&path).expect("the file").len();
        sqlx::query("INSERT INTO t VALUES (zeroblob(40000))")
            .execute(store.write())
            .await
            .expect("inserts");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut size = before;
        while size < before + 40_000 && std::time::Instant::now() < deadline {
            tokio::time::sleep(CHECKPOINT_EVERY).await;
            size = std::fs::metadata(&path).expect("the file").len();
        }
        let after_write = checkpoints_started(&store) - settled - idle;
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(idle, 0, "checkpoints run in 12 idle ticks");
        assert!(after_write >= 1, "no checkpoint after the write");
        assert!(
            size >= before + 40_000,
            "the write was not copied: the file stayed at {size} bytes (from {before})"
        );
    }

    #[tokio::test]
    async fn a_long_log_restarted_while_idle_rests_until_the_next_write() {
        let (dir, _, store) = scratch_store().await;
        // Past RESTART_AT_PAGES in one commit, then nothing: the log reads as long until the
        // next write starts it over, so a checkpointer that counted its own restart as a
        // write would restart it on every tick.
        let pages = RESTART_AT_PAGES + 200;
        sqlx::query(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $1) \
             INSERT INTO t SELECT zeroblob(4000) FROM n",
        )
        .bind(pages)
        .execute(store.write())
        .await
        .expect("inserts");
        let settled = checkpoints_settled(&store).await;
        tokio::time::sleep(CHECKPOINT_EVERY * 12).await;
        let idle = checkpoints_started(&store) - settled;
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            idle, 0,
            "checkpoints run in 12 idle ticks after the restart"
        );
    }

    #[tokio::test]
    async fn the_wal_starts_over_under_sustained_writes() {
        let (dir, _, store) = scratch_store().await;
        // 40,000 pages, 500 per commit, back to back. With only PASSIVE checkpoints and the
        // writer's own, the WAL held 29,860 of 30,000 when tried on a busy machine.
        for _ in 0..80 {
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
                 INSERT INTO t SELECT zeroblob(4000) FROM n",
            )
            .execute(store.write())
            .await
            .expect("inserts");
        }
        let wal = std::fs::metadata(dir.join("v.db-wal"))
            .expect("the WAL")
            .len();
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        let bound = u64::try_from(RESTART_AT_PAGES).expect("positive");
        let frame = 4096 + 24;
        // As much again as slack: what the writer commits while a checkpoint runs.
        assert!(
            wal <= 2 * bound * frame,
            "the WAL grew to {} frames ({wal} bytes), past 2 × {bound}",
            wal / frame
        );
    }

    #[tokio::test]
    async fn a_long_read_delays_the_restart_not_the_writes() {
        let (dir, _, store) = scratch_store().await;
        let mut reading = store.read().begin().await.expect("a read transaction");
        sqlx::query("SELECT COUNT(*) FROM t")
            .execute(&mut *reading)
            .await
            .expect("reads");
        // 20,000 pages past a reader that keeps its snapshot all along, so every RESTART
        // waits for it in vain: with the connection's 10 s busy timeout instead of
        // RESTART_WAIT, one write would wait that long.
        let mut slowest = Duration::ZERO;
        for _ in 0..40 {
            let started = std::time::Instant::now();
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500) \
                 INSERT INTO t SELECT zeroblob(4000) FROM n",
            )
            .execute(store.write())
            .await
            .expect("inserts");
            slowest = slowest.max(started.elapsed());
        }
        reading.rollback().await.expect("ends the read");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            slowest < Duration::from_secs(2),
            "a write waited {slowest:?} behind a checkpoint waiting for a reader"
        );
    }
}
