//! Delivery faults of issue 8 (items 5, 6, 7 and the status filter), each against the real
//! binary and real receivers on 127.0.0.1, on both backends.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common::receiver::{Receiver, Step};
use serde_json::Value;

use crate::common::{Backend, MANUAL_WORKER, Reply, Server, TestDb, new_key, sim_swap};

/// A server whose own worker runs every second, with callbacks to this machine allowed.
const WORKER_EVERY_SECOND: [(&str, &str); 2] = [
    ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
    ("VERDICT_RETRY_INTERVAL_SECS", "1"),
];

/// Item 5: a worker running continuously retries at every interval, not every other one, and
/// never twice in one round.
async fn a_running_worker_retries_at_every_interval(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    receiver.answer_by_default(Step::status(503));
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &WORKER_EVERY_SECOND);

    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900601"))
        .await;
    assert_eq!(reply.status, 200);

    // Note when each attempt arrives: the inline one, then the worker's three.
    let started = Instant::now();
    let mut arrivals = Vec::new();
    while arrivals.len() < 4 && started.elapsed() < Duration::from_secs(12) {
        let n = receiver.received().len();
        while arrivals.len() < n {
            arrivals.push(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        arrivals.len(),
        4,
        "1 inline + 3 worker attempts: {arrivals:?}"
    );
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("{backend:?}: gaps between attempts {gaps:?}");
    // Inline to the first retry: due one interval after the inline attempt, taken by the first
    // round after that, so at most two intervals.
    assert!(gaps[0] < Duration::from_millis(2300), "gaps {gaps:?}");
    // Three worker attempts take two intervals (about 2 s), not four (about 4 s, as before
    // the fix: [2.07 s, 1.73 s, 2.00 s] measured); none comes twice in one round.
    let retries = arrivals[3] - arrivals[1];
    assert!(
        retries < Duration::from_millis(3000),
        "worker retries one interval apart, not two: gaps {gaps:?}"
    );
    for gap in &gaps[1..] {
        assert!(
            *gap > Duration::from_millis(600),
            "one attempt per round: gaps {gaps:?}"
        );
    }

    // Nothing more comes: the delivery is dead after its three retries.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.received().len(), 4);
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let event = server.event(&tenant, &event_id).await;
    assert_eq!(event["deliveries"][0]["status"], "dead", "{event}");
}

/// Item 7: a 503 with an HTTP-date `Retry-After` an hour ahead puts the next attempt an hour out.
async fn retry_after_as_an_http_date_is_honoured(backend: Backend) {
    let db = TestDb::new(backend).await;
    let in_an_hour = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(3600));
    let receiver =
        Receiver::start(vec![Step::status(503).header("retry-after", &in_an_hour)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900602"))
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(receiver.received().len(), 1);

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        db.worker_once(&MANUAL_WORKER)["attempted"],
        0,
        "not due for an hour"
    );
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let event = server.event(&tenant, &event_id).await;
    let d = &event["deliveries"][0];
    assert_eq!(d["status"], "pending");
    let next = time::OffsetDateTime::parse(
        d["next_attempt_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let ahead = next - time::OffsetDateTime::now_utc();
    assert!(
        ahead > time::Duration::minutes(58) && ahead < time::Duration::minutes(61),
        "next attempt in {ahead}"
    );
}

/// Item 6: the attempt deadline has bounds, refused with a clear message by `serve` and
/// `worker` alike, before either does anything.
async fn an_attempt_deadline_out_of_bounds_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    for deadline in ["0", "30001", "600000"] {
        for args in [
            &["worker", "--once"][..],
            &["worker"][..],
            &["serve", "--listen", "127.0.0.1:0"][..],
        ] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_verdict"));
            cmd.args(args)
                .env("VERDICT_DATABASE_URL", &db.url)
                .env("VERDICT_MASTER_KEY", &db.master_key)
                .env("VERDICT_INLINE_DEADLINE_MS", deadline)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut child = cmd.spawn().unwrap();
            // A process that accepted the setting keeps running: give it a few seconds.
            let mut status = None;
            for _ in 0..100 {
                if let Some(s) = child.try_wait().unwrap() {
                    status = Some(s);
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let Some(status) = status else {
                let _ = child.kill();
                let _ = child.wait();
                panic!("verdict {args:?} accepted a {deadline} ms deadline and kept running");
            };
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            assert!(
                !status.success(),
                "verdict {args:?} accepted a {deadline} ms deadline: {stderr}"
            );
            assert!(
                stderr.contains("VERDICT_INLINE_DEADLINE_MS") && stderr.contains("30000"),
                "a clear message for {deadline} ms from {args:?}: {stderr}"
            );
        }
    }
}

/// Status filter: a known status filters, an unknown one is a 400 problem.
async fn an_unknown_status_filter_is_a_400_problem(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900603"))
        .await;
    assert_eq!(reply.status, 200);

    let pending = server
        .get(&tenant, "/v1/deliveries?status=pending")
        .await
        .json();
    assert_eq!(pending["data"].as_array().unwrap().len(), 1, "{pending}");
    assert_eq!(pending["data"][0]["status"], "pending");
    let dead = server
        .get(&tenant, "/v1/deliveries?status=dead")
        .await
        .json();
    assert_eq!(dead["data"].as_array().unwrap().len(), 0, "{dead}");

    let bad: Reply = server.get(&tenant, "/v1/deliveries?status=bogus").await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("content-type"), Some("application/problem+json"));
    assert_eq!(bad.json()["status"], 400);
}

/// A `verdict worker` process on the test's database, retrying every second.
fn spawn_worker(db: &TestDb) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_verdict"))
        .arg("worker")
        .env("VERDICT_DATABASE_URL", &db.url)
        .env("VERDICT_MASTER_KEY", &db.master_key)
        .env("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")
        .env("VERDICT_RETRY_INTERVAL_SECS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits until the receiver has `n` requests, for at most `within`; returns how long it took.
async fn wait_for_requests(receiver: &Receiver, n: usize, within: Duration) -> Duration {
    let started = Instant::now();
    while receiver.received().len() < n {
        assert!(
            started.elapsed() < within,
            "{} of {n} requests after {within:?}",
            receiver.received().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// Issue 28, item 3: a worker SIGKILLed while one of its attempts is in flight. The other
/// delivery it was sending is not held up, and the one it held goes out again, with the same
/// `webhook-id` and bytes, once its lease (the deadline and 30 s) is over, not before.
async fn a_worker_killed_mid_send_holds_up_only_its_own_delivery(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Both inline attempts refused; of the worker's two attempts, the first to arrive hangs.
    let receiver = Receiver::start(vec![
        Step::status(503),
        Step::status(503),
        Step::slow(200, Duration::from_secs(20)),
    ])
    .await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    for phone in ["+447700900621", "+447700900622"] {
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(reply.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let mut first = spawn_worker(&db);
    wait_for_requests(&receiver, 4, Duration::from_secs(10)).await;
    // The hanging attempt's lease was taken just before the receiver got it.
    let leased = Instant::now();
    let got = receiver.received();
    let (stuck, other) = (&got[2], &got[3]);
    let other_id = other.header("webhook-id").to_owned();
    // The receiver has the other request; the worker records its answer a moment later, while
    // the first still hangs (for 20 s).
    let recorded = Instant::now();
    loop {
        let delivered: Vec<Value> = server
            .get(&tenant, "/v1/deliveries?status=succeeded")
            .await
            .json()["data"]
            .as_array()
            .unwrap()
            .clone();
        if delivered
            .iter()
            .any(|d| d["webhook_id"] == other_id.as_str())
        {
            break;
        }
        assert!(
            recorded.elapsed() < Duration::from_secs(5),
            "the other delivery went through while the first hung: {delivered:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();

    let mut second = spawn_worker(&db);
    wait_for_requests(&receiver, 5, Duration::from_secs(45)).await;
    let again_after = leased.elapsed();
    let resent = &receiver.received()[4];
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(resent.header("webhook-id"), stuck.header("webhook-id"));
    assert_eq!(resent.body, stuck.body, "the same bytes");
    // The lease lasts 35 s; the second worker takes it up within its 1 s interval.
    assert!(
        again_after > Duration::from_secs(30) && again_after < Duration::from_secs(40),
        "sent again {again_after:?} after its lease was taken, the lease being 35 s"
    );
    assert_eq!(receiver.received().len(), 5, "nothing else sent twice");
}

on_both_backends!(
    a_worker_killed_mid_send_holds_up_only_its_own_delivery,
    a_running_worker_retries_at_every_interval,
    retry_after_as_an_http_date_is_honoured,
    an_attempt_deadline_out_of_bounds_is_refused,
    an_unknown_status_filter_is_a_400_problem,
);
