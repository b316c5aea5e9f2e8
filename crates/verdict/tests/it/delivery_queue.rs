//! The worker's queue: a delivery is in `delivery_queue` while it is pending, at the time it is
//! due, whichever statement writes its status, except under the lease it was made with (an
//! inline attempt's), which the worker's sweep queues only once it runs out; and on PostgreSQL
//! the update that records an inline attempt's success stays in place (no index of
//! `deliveries` names a column it changes), which is what the queue being a table of its own
//! is for.

use std::time::{Duration, Instant};

use crate::common::deliveries::{delivery_of, wait_for_next_round};
use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Server, TestDb, new_key, sim_swap};

const RETRY_INTERVAL: [(&str, &str); 1] = [("VERDICT_RETRY_INTERVAL_SECS", "1")];

/// Queue rows, and those that match a pending delivery at its due time.
async fn queue(db: &TestDb) -> (i64, i64) {
    let rows = db.scalar("SELECT COUNT(*) FROM delivery_queue").await;
    let matching = db
        .scalar(
            "SELECT COUNT(*) FROM delivery_queue q JOIN deliveries d ON d.id = q.id \
             AND d.next_attempt_at = q.next_attempt_at WHERE d.status = 'pending'",
        )
        .await;
    (rows, matching)
}

async fn listed(server: &Server, tenant: &crate::common::Tenant, status: &str) -> usize {
    server
        .get(tenant, &format!("/v1/deliveries?status={status}"))
        .await
        .json()["data"]
        .as_array()
        .unwrap()
        .len()
}

async fn a_delivery_is_queued_while_it_waits_for_a_retry_and_leaves_when_it_succeeds(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);

    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900601"))
        .await;
    assert_eq!(reply.status, 200);
    let delivery = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(delivery["status"], "pending", "{delivery}");
    assert_eq!(
        queue(&db).await,
        (1, 1),
        "queued at the retry's time after the inline 503"
    );
    assert_eq!(listed(&server, &tenant, "pending").await, 1);
    assert_eq!(listed(&server, &tenant, "succeeded").await, 0);
    let other = db.tenant(&["--callback-url", &receiver.url]);
    assert_eq!(
        listed(&server, &other, "pending").await,
        0,
        "another tenant's queue rows are not listed"
    );

    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    assert_eq!(queue(&db).await, (0, 0), "settled, so out of the queue");
    assert_eq!(listed(&server, &tenant, "pending").await, 0);
    assert_eq!(listed(&server, &tenant, "succeeded").await, 1);
    assert_eq!(receiver.received().len(), 2);
}

async fn every_write_of_a_deliverys_status_or_due_time_keeps_the_queue(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900602"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );
    assert_eq!(queue(&db).await, (0, 0));

    let steps: [(&str, (i64, i64)); 7] = [
        (
            "UPDATE deliveries SET status = 'pending', next_attempt_at = 5",
            (1, 1),
        ),
        ("UPDATE deliveries SET next_attempt_at = 7", (1, 1)),
        (
            "UPDATE deliveries SET leased_until = 9, attempts = 2",
            (1, 1),
        ),
        ("UPDATE deliveries SET status = 'suspended'", (0, 0)),
        ("UPDATE deliveries SET status = 'pending'", (1, 1)),
        ("UPDATE deliveries SET status = 'dead'", (0, 0)),
        ("UPDATE deliveries SET status = 'pending'", (1, 1)),
    ];
    for (sql, want) in steps {
        assert_eq!(db.exec(sql).await, 1);
        assert_eq!(queue(&db).await, want, "after {sql}");
    }
    assert_eq!(
        db.scalar("SELECT MIN(next_attempt_at) FROM delivery_queue")
            .await,
        7
    );
    assert_eq!(listed(&server, &tenant, "pending").await, 1);
    db.exec("DELETE FROM deliveries").await;
    assert_eq!(
        queue(&db).await,
        (0, 0),
        "a deleted delivery leaves no queue row"
    );
}

async fn a_pending_delivery_under_a_lease_is_queued_only_once_the_lease_runs_out(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900603"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );

    // As a holder that died mid-attempt leaves it: pending, leased for a minute, and not in
    // the queue (a delivery made under a lease is queued only if the lease runs out).
    let in_a_minute = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 60_000;
    db.exec(format!(
        "UPDATE deliveries SET status = 'pending', next_attempt_at = 0, \
         leased_until = {in_a_minute}"
    ))
    .await;
    db.exec("DELETE FROM delivery_queue").await;
    assert_eq!(
        listed(&server, &tenant, "pending").await,
        1,
        "listed as pending while under its lease, though not queued"
    );
    assert_eq!(
        db.worker_once(&RETRY_INTERVAL)["attempted"],
        0,
        "not while the lease holds"
    );
    assert_eq!(queue(&db).await, (0, 0), "not queued while the lease holds");

    assert_eq!(db.end_leases("TRUE").await, 1);
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    assert_eq!(queue(&db).await, (0, 0));
    assert_eq!(receiver.received().len(), 2);
    assert_eq!(listed(&server, &tenant, "pending").await, 0);
}

on_both_backends!(
    a_delivery_is_queued_while_it_waits_for_a_retry_and_leaves_when_it_succeeds,
    every_write_of_a_deliverys_status_or_due_time_keeps_the_queue,
    a_pending_delivery_under_a_lease_is_queued_only_once_the_lease_runs_out,
);

/// PostgreSQL's counters of the test database's `deliveries`: updates, and those made in
/// place (HOT). A backend reports its counters when idle, at most a second apart, so they are
/// read until they stop changing.
async fn deliveries_updates(db: &TestDb) -> (i64, i64) {
    let read = || async {
        (
            db.scalar("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'deliveries'")
                .await,
            db.scalar("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'deliveries'")
                .await,
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = read().await;
    loop {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let now = read().await;
        if (now == last && now.0 > 0) || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_records_an_inline_success_in_place_without_new_index_entries() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    for i in 0..5 {
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap(&format!("+44770090061{i}")),
            )
            .await;
        assert_eq!(
            delivery_of(&server, &tenant, &reply).await["status"],
            "succeeded"
        );
    }
    let (updates, in_place) = deliveries_updates(&db).await;
    assert!(updates >= 5, "five inline attempts recorded: {updates}");
    assert_eq!(
        in_place, updates,
        "every record of an inline success is a HOT update"
    );
    assert_eq!(queue(&db).await, (0, 0));
}

/// PostgreSQL logs an in-place update as the new row's bytes between the prefix and the suffix
/// it shares with the old row, so the columns an inline success changes are kept together at
/// the row's end (postgres/0034): no column that holds a value and keeps it lies between two
/// that change. A trigger of the test's own notes, for each update, each column's position,
/// whether it changed, and whether it holds a value after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_inline_success_changes_one_unbroken_stretch_of_columns() {
    let db = TestDb::new(Backend::Postgres).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    db.exec("CREATE TABLE updated_columns (update_no BIGINT, attnum INT, changed BOOL, held BOOL)")
        .await;
    db.exec("CREATE SEQUENCE update_nos").await;
    db.exec(
        "CREATE FUNCTION note_updated_columns() RETURNS trigger LANGUAGE plpgsql AS $$ \
         DECLARE n BIGINT := nextval('update_nos'); \
         BEGIN \
             INSERT INTO updated_columns \
             SELECT n, a.attnum, \
                 (to_jsonb(OLD) -> a.attname) IS DISTINCT FROM (to_jsonb(NEW) -> a.attname), \
                 (to_jsonb(NEW) -> a.attname) <> 'null'::jsonb \
             FROM pg_attribute a \
             WHERE a.attrelid = TG_RELID AND a.attnum > 0 AND NOT a.attisdropped; \
             RETURN NULL; \
         END $$",
    )
    .await;
    db.exec(
        "CREATE TRIGGER note_updated_columns AFTER UPDATE ON deliveries \
         FOR EACH ROW EXECUTE FUNCTION note_updated_columns()",
    )
    .await;
    let server = Server::start(&db, &MANUAL_WORKER);
    for i in 0..3 {
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap(&format!("+44770090062{i}")),
            )
            .await;
        assert_eq!(
            delivery_of(&server, &tenant, &reply).await["status"],
            "succeeded"
        );
    }

    assert_eq!(
        db.scalar("SELECT COUNT(DISTINCT update_no) FROM updated_columns WHERE changed")
            .await,
        3,
        "each inline success is one update that changes something"
    );
    let kept_between = db
        .text(
            "SELECT COALESCE(string_agg(DISTINCT a.attname, ', '), '') \
             FROM updated_columns u \
             JOIN pg_attribute a ON a.attrelid = 'deliveries'::regclass AND a.attnum = u.attnum \
             WHERE NOT u.changed AND u.held \
                 AND u.attnum > (SELECT min(attnum) FROM updated_columns c \
                     WHERE c.update_no = u.update_no AND c.changed) \
                 AND u.attnum < (SELECT max(attnum) FROM updated_columns c \
                     WHERE c.update_no = u.update_no AND c.changed)",
        )
        .await;
    assert_eq!(
        kept_between, "",
        "columns an inline success leaves alone, between columns it changes"
    );
}
