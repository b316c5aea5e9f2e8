//! The fault suite's skewed clocks (issue 28 item 6): two instances on one PostgreSQL, one
//! whose clock runs 30 s ahead and one 30 s behind (Debian's `faketime`, preloaded into the
//! real binary). Locks and key expiries are compared across them, so both must read the
//! database's clock: no lock is taken over early, and no key expires early or late by more than
//! the clocks' measured error.
//!
//! Runs under `scripts/faults` (`VERDICT_FAULTS=short|long`; a plain `cargo test` skips it),
//! which installs `faketime` when it is missing.

use std::time::Duration;

use serde_json::Value;

use crate::common::effects::EffectReceiver;
use crate::common::scenario::{KeepLog, Size};
use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, sim_swap_of_account};

/// Debian's libfaketime, which shifts the clock a process reads.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How far each instance's clock is off.
const SKEW: &str = "30s";

/// The lock timeout both instances run with: shorter than the 60 s between their clocks, so an
/// instance that trusted its own clock would see the other's live lock as expired at once.
const LOCK_TIMEOUT_SECS: u64 = 40;

/// The key lifetime both run with: long enough to replay a key across instances, short enough
/// to wait out.
const KEY_TTL_SECS: u64 = 20;

/// How long the tenant's system takes to answer a connector call: the time a key stays locked.
const CALL_TAKES: Duration = Duration::from_secs(3);

/// How far from the test's own clock an instance's times may be: the offset's measurement
/// error (half a round trip) and the time between reading a clock and storing the reading.
const CLOCK_TOLERANCE_MS: i64 = 2_000;

/// A server whose clock is `shift` (`+30s`, `-30s`) off the machine's.
fn skewed_server(db: &TestDb, shift: &str) -> Server {
    let lock = LOCK_TIMEOUT_SECS.to_string();
    let ttl = KEY_TTL_SECS.to_string();
    Server::start(
        db,
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", shift),
            // Only the wall clock: timers run on the monotonic one, which must not jump.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ("FAKETIME_NO_CACHE", "1"),
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("VERDICT_LOCK_TIMEOUT_SECS", &lock),
            ("VERDICT_KEY_TTL_SECS", &ttl),
        ],
    )
}

/// Milliseconds since the epoch by the test's (the machine's) clock.
fn real_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The time the event behind `reply` was created, as the instance that created it stored it.
async fn created_at(server: &Server, tenant: &Tenant, reply: &Reply) -> i64 {
    let id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let event: Value = server.event(tenant, &id).await;
    let at = event["created_at"]
        .as_str()
        .unwrap_or_else(|| panic!("{event}"));
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{at}: {e}"));
    (at.unix_timestamp_nanos() / 1_000_000) as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_with_skewed_clocks_take_no_lock_early_and_expire_keys_on_time() {
    let Some(size) = Size::from_env("skewed clocks") else {
        return;
    };
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: scripts/faults installs Debian's faketime"
    );
    let db = TestDb::new(Backend::Postgres).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let cases = EffectReceiver::start(CALL_TAKES).await;
    db.set_http_connector(&tenant, "cases", &cases.url);
    db.set_playbook(
        &tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["open_case"]

[actions.open_case]
connector = "cases"
"#,
    );
    let ahead = skewed_server(&db, &format!("+{SKEW}"));
    let behind = skewed_server(&db, &format!("-{SKEW}"));
    let _keep = (
        KeepLog(&ahead, "skewed-clocks-ahead"),
        KeepLog(&behind, "skewed-clocks-behind"),
    );

    // The skew is real (each instance measured it against the database) and the times the
    // instances store are the database's, not their own.
    for (server, name) in [(&ahead, "ahead"), (&behind, "behind")] {
        assert!(
            server.logged("clock differs from the database").await,
            "the instance {name} did not measure its skew"
        );
    }
    let mut stored_times = 0;
    for (server, name) in [(&ahead, "ahead"), (&behind, "behind")] {
        let before = real_ms();
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap_of_account(&new_key(), 5),
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let after = real_ms();
        let at = created_at(server, &tenant, &reply).await;
        assert!(
            at >= before - CLOCK_TOLERANCE_MS && at <= after + CLOCK_TOLERANCE_MS,
            "the instance {name} stored {at}, outside [{before}, {after}] by the machine's clock"
        );
        stored_times += 1;
    }

    // Locks: a key held by the instance behind (its connector call in flight) is refused by
    // the instance ahead with 409, never taken over, and answered once the holder finishes.
    let contests = size.pick(3, 12);
    let mut refused_while_held = 0;
    for round in 0..contests {
        let key = new_key();
        let body = sim_swap_of_account(&format!("acct-{round}-{key}"), 5);
        let (holder, taker) = if round % 2 == 0 {
            (&behind, &ahead)
        } else {
            (&ahead, &behind)
        };
        let (first, contested) = tokio::join!(holder.send(&tenant, Some(&key), &body), async {
            tokio::time::sleep(CALL_TAKES / 3).await;
            taker.send(&tenant, Some(&key), &body).await
        });
        assert_eq!(
            contested.status,
            409,
            "round {round}: a key locked by the other instance was not refused: {}",
            contested.text()
        );
        refused_while_held += 1;
        assert_eq!(first.status, 200, "round {round}: {}", first.text());
        let replay = taker.send(&tenant, Some(&key), &body).await;
        assert_eq!(replay.status, 200, "round {round}: {}", replay.text());
        assert!(
            replay.replayed(),
            "round {round}: the other instance acted again"
        );
        assert_eq!(replay.json()["event_id"], first.json()["event_id"]);
    }
    let calls = cases.calls().len();
    assert_eq!(
        calls,
        contests + stored_times,
        "each signal's connector call is made once: {:?}",
        cases.applied()
    );

    // Expiry: a key stored by one instance is replayed by the other until it expires by the
    // database's clock, not earlier (the instance ahead would see it 60 s early by its own), and
    // is fresh after it, not later (the instance behind would see it 60 s late).
    let expiries = size.pick(1, 3);
    for round in 0..expiries {
        let (storer, reader) = if round % 2 == 0 {
            (&behind, &ahead)
        } else {
            (&ahead, &behind)
        };
        let key = new_key();
        let body = sim_swap_of_account(&format!("exp-{round}-{key}"), 5);
        let stored_at = real_ms();
        let first = storer.send(&tenant, Some(&key), &body).await;
        assert_eq!(first.status, 200, "{}", first.text());
        let ttl_ms = (KEY_TTL_SECS * 1000) as i64;
        // Halfway through its life, by the machine's clock: still held, on both.
        sleep_until_ms(stored_at + ttl_ms / 2).await;
        let early = reader.send(&tenant, Some(&key), &body).await;
        assert!(
            early.status == 200 && early.replayed(),
            "round {round}: the key expired early on the other instance: {} {}",
            early.status,
            early.text()
        );
        assert_eq!(early.json()["event_id"], first.json()["event_id"]);
        // Just past its life: expired on both, so the storer decides it afresh.
        sleep_until_ms(stored_at + ttl_ms + CLOCK_TOLERANCE_MS + 3_000).await;
        let late = storer.send(&tenant, Some(&key), &body).await;
        assert_eq!(late.status, 200, "{}", late.text());
        assert!(
            !late.replayed() && late.json()["event_id"] != first.json()["event_id"],
            "round {round}: the key outlived its lifetime on the instance that stored it"
        );
    }

    println!(
        "skewed clocks: 2 instances at +{SKEW} and -{SKEW}, {stored_times} stored times within \
         {CLOCK_TOLERANCE_MS} ms, {contests} locks contested ({refused_while_held} refused, 0 taken \
         over), {expiries} keys expired on time, {calls} connector calls for {calls} signals"
    );
    assert_eq!(
        refused_while_held, contests,
        "faults injected: every contest must have happened"
    );
}

/// Sleeps until `at_ms` by the machine's clock.
async fn sleep_until_ms(at_ms: i64) {
    let wait = at_ms - real_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}
