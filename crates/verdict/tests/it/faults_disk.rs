//! A full disk (issue 28, item 5): SQLite's file, or PostgreSQL's data directory, on a small
//! filesystem of the test's own (a sized tmpfs, mounted as root) fills up under load. Signals
//! answer 503 with `Retry-After`, never a stored 5xx or a partial write, and the service
//! recovers by itself when space returns.
//!
//! PostgreSQL's write-ahead log stays on another volume: a WAL that cannot be written makes
//! PostgreSQL stop (a PANIC, by design, since it cannot promise durability), and bringing it
//! back is the operator's, not something verdict could ride out; a full data volume fails
//! statements that need new pages (`53100`, `could not extend file`) and leaves the server up.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::TestDb;
use crate::common::cluster::Cluster;
use crate::common::receiver::Receiver;
use crate::common::retrying::Tally;
use crate::common::scenario::{
    KeepLog, Load, Size, check_callbacks, check_exactly_once, server_env, start_server,
};

/// A tmpfs of `megabytes` mounted at a fresh folder; unmounted when dropped.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(megabytes: u32) -> SmallDisk {
        SmallDisk::mount_with(&format!("size={megabytes}M"))
    }

    /// One whose root belongs to the `postgres` user, for a data directory.
    fn mount_for_postgres(megabytes: u32) -> SmallDisk {
        let id = |flag: &str| {
            let out = Command::new("id")
                .args([flag, "postgres"])
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        let (uid, gid) = (id("-u"), id("-g"));
        SmallDisk::mount_with(&format!("size={megabytes}M,uid={uid},gid={gid},mode=0755"))
    }

    fn mount_with(options: &str) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!("verdict-disk-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount (run as root: scripts/faults does)");
        assert!(status.success(), "mounting a tmpfs ({options}) at {dir:?}");
        SmallDisk { dir }
    }

    /// Fills every byte left with a file of its own; returns the bytes it took.
    fn fill(&self) -> u64 {
        let mut filler = std::fs::File::create(self.filler()).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        while filler.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
        }
        // The last partial chunk: byte by byte is too slow, a smaller chunk is enough.
        let small = vec![0u8; 512];
        while filler.write_all(&small).is_ok() {
            written += small.len() as u64;
        }
        written
    }

    /// Gives the space back.
    fn free(&self) {
        std::fs::remove_file(self.filler()).unwrap();
    }

    fn filler(&self) -> PathBuf {
        self.dir.join("filler")
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_and_recovers_when_space_returns() {
    let scenario = "full disk (SQLite)";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    // Dropped last (declared first): the database's files go before the filesystem.
    let disk = SmallDisk::mount(64);
    let db = TestDb::sqlite_in(disk.path().join("db"));
    std::fs::create_dir_all(db.dir()).unwrap();
    fill_under_load(scenario, size, &disk, &db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_postgres_data_volume_answers_503_and_recovers_when_space_returns() {
    let scenario = "full disk (PostgreSQL data volume)";
    let Some(size) = Size::from_env(scenario) else {
        return;
    };
    // Dropped in reverse: the database, then the cluster, then the filesystem under it.
    let disk = SmallDisk::mount_for_postgres(192);
    let cluster = Cluster::create_with_data_in("disk", disk.path().join("pgdata"));
    let db = TestDb::in_cluster(&cluster).await;
    fill_under_load(scenario, size, &disk, &db).await;
}

/// Load on a server of `db`, the disk filled for a while and then freed, and every check.
async fn fill_under_load(scenario: &str, size: Size, disk: &SmallDisk, db: &TestDb) {
    let senders = size.pick(8, 24);
    let before = size.pick(Duration::from_secs(2), Duration::from_secs(5));
    let full = size.pick(Duration::from_secs(4), Duration::from_secs(15));
    let after = size.pick(Duration::from_secs(3), Duration::from_secs(5));
    let receiver = Receiver::start(Vec::new()).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = start_server(db, &server_env());
    let _log = KeepLog(&server, scenario);
    let tally = Arc::new(Tally::default());
    let load = Load::start(
        Arc::new(Mutex::new(server.base.clone())),
        &tenant,
        senders,
        tally.clone(),
    );
    tokio::time::sleep(before).await;

    let filled = disk.fill();
    let full_at = Instant::now();
    tokio::time::sleep(full).await;
    let refused_while_full = Tally::get(&tally.unavailable_503);
    disk.free();
    let freed_at = Instant::now();
    tokio::time::sleep(after).await;
    let sent = load.finish().await;

    assert!(
        refused_while_full > 0,
        "{scenario}: the disk filled ({filled} bytes) but no signal was refused"
    );
    assert_eq!(
        Tally::get(&tally.unavailable_without_retry_after),
        0,
        "{scenario}: a 503 without Retry-After"
    );
    let first_after = sent
        .iter()
        .filter(|s| s.answered_at > freed_at && s.reply.status == 200)
        .map(|s| s.answered_at - freed_at)
        .min()
        .unwrap_or_else(|| {
            let statuses: Vec<u16> = sent.iter().map(|s| s.reply.status).collect();
            panic!(
                "{scenario}: no decision once space returned; answers {statuses:?}; {}\n{}",
                tally.summary(),
                server.logs()
            )
        });
    let (event_ids, duplicates) = check_exactly_once(scenario, db, &server, &tenant, &sent).await;
    let attempts = check_callbacks(scenario, db, &receiver, &event_ids).await;
    eprintln!(
        "{scenario}: {} signals under {senders} senders; the disk full for {} ms ({filled} bytes \
         taken), {refused_while_full} × 503 meanwhile; first decision {} ms after space returned; \
         {duplicates} duplicates replayed afterwards; {} callbacks in {attempts} attempts; {}; \
         nothing lost",
        sent.len(),
        (freed_at - full_at).as_millis(),
        first_after.as_millis(),
        event_ids.len(),
        tally.summary()
    );
}
