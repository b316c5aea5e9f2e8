//! Outbound callbacks against real receivers on 127.0.0.1: signatures the reference library
//! accepts, the inline attempt and its deadline, the worker's retries, dead letters and
//! redelivery, and several workers sharing one queue.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::deliveries::{delivery_now, delivery_of, wait_for_next_round};
use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Reply, Server, TestDb, new_key, sim_swap};

const RETRY_INTERVAL: [(&str, &str); 1] = [("VERDICT_RETRY_INTERVAL_SECS", "1")];

async fn a_receiver_answering_503_twice_then_200_gets_three_identical_deliveries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503), Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);

    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900501"))
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(receiver.received().len(), 1, "one inline attempt");
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 1);
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);

    let got = receiver.received();
    assert_eq!(got.len(), 3);
    let first = &got[0];
    assert!(first.header("webhook-id").starts_with("msg_"));
    assert_eq!(first.header("content-type"), "application/json");
    assert!(first.header("user-agent").starts_with("verdict/"));
    let envelope = first.json();
    assert_eq!(envelope["event_id"], reply.json()["event_id"]);
    assert_eq!(envelope["tenant"], tenant.id);
    assert_eq!(envelope["event_type"], "decision.sim_swap");
    assert_eq!(envelope["subject_hash"], reply.json()["subject_hash"]);
    assert_eq!(envelope["decision"], "deny");
    assert_eq!(
        envelope["metadata"],
        serde_json::json!({"case_ref": "abc-1"})
    );
    for later in &got[1..] {
        assert_eq!(later.header("webhook-id"), first.header("webhook-id"));
        assert_eq!(
            later.body, first.body,
            "the envelope is built once, timestamp included"
        );
    }
    receiver.verify_all_with_python(&tenant.webhook_secret);
    // The retries rendered it from the event's row: the outbox row keeps no copy of it.
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries WHERE length(payload) = 0")
            .await,
        1
    );
    // Nor of its `webhook-id`: the retries and the listing derive it from the row.
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries WHERE webhook_id = ''")
            .await,
        1
    );
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["webhook_id"],
        first.header("webhook-id")
    );

    let delivery = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(delivery["status"], "succeeded");
    let codes: Vec<_> = delivery["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status_code"].clone())
        .collect();
    assert_eq!(codes, vec![503, 503, 200]);
    assert_eq!(delivery["attempts"][0]["trigger"], "inline");
}

async fn an_inline_attempt_is_recorded_on_its_delivery_and_listed_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900509"))
        .await;
    assert_eq!(reply.status, 200);
    // Waits until the API shows the inline attempt's record.
    delivery_of(&server, &tenant, &reply).await;
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries WHERE inline_attempted_at IS NOT NULL")
            .await,
        1,
        "the inline attempt is on its delivery"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM delivery_attempts").await,
        0,
        "and is no row of its own"
    );
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM delivery_attempts").await, 1);

    let delivery = delivery_of(&server, &tenant, &reply).await;
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{delivery}");
    assert_eq!(attempts[0]["trigger"], "inline");
    assert_eq!(attempts[0]["status_code"], 503);
    assert_eq!(attempts[1]["trigger"], "worker");
    assert_eq!(attempts[1]["status_code"], 200);
    assert_eq!(delivery["status"], "succeeded");
}

async fn a_receiver_that_sleeps_10s_does_not_hold_the_response_past_the_deadline(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::slow(200, Duration::from_secs(10))]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);

    let started = Instant::now();
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900502"))
        .await;
    let took = started.elapsed();
    assert_eq!(reply.status, 200);
    assert!(took < Duration::from_millis(6000), "ingest took {took:?}");
    assert!(
        took >= Duration::from_millis(4500),
        "the inline attempt had its 5 s: {took:?}"
    );

    // The background attempt gives up at its deadline and records a retryable failure.
    let mut status = String::new();
    for _ in 0..40 {
        let d = delivery_of(&server, &tenant, &reply).await;
        if d["attempts"].as_array().unwrap().len() == 1 {
            status = d["status"].as_str().unwrap().to_owned();
            assert!(
                d["attempts"][0]["error"]
                    .as_str()
                    .unwrap()
                    .contains("timed out")
                    || d["attempts"][0]["error"]
                        .as_str()
                        .unwrap()
                        .contains("timeout"),
                "{d}"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "pending");
    wait_for_next_round().await;
    assert_eq!(
        db.worker_once(&RETRY_INTERVAL)["delivered"],
        1,
        "the worker retries it"
    );
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );
}

async fn a_400_is_terminal_after_one_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(400)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900503"))
        .await;
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 0);
    assert_eq!(receiver.received().len(), 1);
    let delivery = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(delivery["status"], "failed");
    assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1);
    // The CLI shows the same delivery and attempt, read together.
    let shown: serde_json::Value = serde_json::from_str(&db.cli(&[
        "deliveries",
        "show",
        "--tenant",
        &tenant.id,
        delivery["id"].as_str().unwrap(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(shown["status"], "failed", "{shown}");
    assert_eq!(shown["attempts"][0]["status_code"], 400, "{shown}");
    assert_eq!(shown["attempts"].as_array().unwrap().len(), 1, "{shown}");
    let failed = server
        .get(&tenant, "/v1/deliveries?status=failed")
        .await
        .json();
    assert_eq!(failed["data"].as_array().unwrap().len(), 1);
}

async fn a_410_is_terminal_and_disables_the_endpoint_until_re_enabled(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(410)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900504"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &first).await["status"],
        "failed"
    );

    let second = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900505"))
        .await;
    let callback = second.json()["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "callback")
        .unwrap()
        .clone();
    assert_eq!(
        callback["outcome"], "pending",
        "kept, suspended, for when the endpoint is re-enabled"
    );
    assert_eq!(
        receiver.received().len(),
        1,
        "nothing more is sent to a disabled endpoint"
    );

    db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        &receiver.url,
    ]);
    let third = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900506"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &third).await["status"],
        "succeeded"
    );
}

/// The stored bytes of the one suspended delivery, as text (callback envelopes are JSON).
async fn suspended_payload(db: &TestDb) -> String {
    db.text(match db.backend {
        Backend::Sqlite => {
            "SELECT CAST(payload AS TEXT) FROM deliveries WHERE status = 'suspended'"
        }
        Backend::Postgres => {
            "SELECT convert_from(payload, 'UTF8') FROM deliveries WHERE status = 'suspended'"
        }
    })
    .await
}

/// When the event of the one suspended delivery was stored, as its callback's envelope gives
/// it (RFC 3339).
async fn suspended_event_time(db: &TestDb) -> String {
    let created_at = db
        .scalar(
            "SELECT e.created_at FROM events e JOIN deliveries d ON d.event_id = e.id \
             WHERE d.status = 'suspended'",
        )
        .await;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(created_at) * 1_000_000)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A 410 disables the endpoint; the signal decided next keeps its callback `suspended`.
async fn a_suspended_callback(
    db: &TestDb,
    server: &Server,
    tenant: &crate::common::Tenant,
    receiver: &Receiver,
) -> (Reply, serde_json::Value) {
    let first = server
        .send(tenant, Some(&new_key()), &sim_swap("+447700900521"))
        .await;
    assert_eq!(
        delivery_of(server, tenant, &first).await["status"],
        "failed"
    );
    let second = server
        .send(tenant, Some(&new_key()), &sim_swap("+447700900522"))
        .await;
    assert_eq!(second.status, 200, "{}", second.text());
    let callback = common::action_outcome(&second.json(), "callback")["outcome"].clone();
    assert_eq!(callback, "pending", "{}", second.text());
    let suspended = delivery_now(server, tenant, &second).await;
    assert_eq!(suspended["status"], "suspended", "{suspended}");
    assert_eq!(suspended["attempts"], serde_json::json!([]), "{suspended}");
    let listed = server
        .get(tenant, "/v1/deliveries?status=suspended")
        .await
        .json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");
    wait_for_next_round().await;
    assert_eq!(
        db.worker_once(&RETRY_INTERVAL)["attempted"],
        0,
        "a suspended callback is not attempted"
    );
    assert_eq!(receiver.received().len(), 1, "only the 410");
    (second, suspended)
}

async fn a_callback_decided_while_the_endpoint_is_disabled_is_sent_once_when_re_enabled(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(410)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let (reply, _) = a_suspended_callback(&db, &server, &tenant, &receiver).await;
    assert_eq!(
        suspended_payload(&db).await,
        "",
        "its envelope is rendered from its event"
    );
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let decided_at = suspended_event_time(&db).await;

    let out = db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        &receiver.url,
    ]);
    assert!(out.contains("1 suspended callback(s) due again"), "{out}");
    assert_eq!(
        delivery_now(&server, &tenant, &reply).await["status"],
        "pending"
    );
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 0, "sent once");

    let got = receiver.received();
    assert_eq!(got.len(), 2, "the 410, then the resumed callback once");
    assert_eq!(
        got[1].header("webhook-id"),
        format!("msg_{}", event_id.replace('-', ""))
    );
    let resumed = got[1].json();
    assert_eq!(resumed["event_id"], reply.json()["event_id"]);
    assert_eq!(
        resumed["timestamp"], decided_at,
        "the envelope of the decision, built when it was decided"
    );
    assert_eq!(resumed["decision"], reply.json()["decision"]);
    assert_eq!(
        resumed["metadata"],
        serde_json::json!({"case_ref": "abc-1"})
    );
    receiver.verify_all_with_python(&tenant.webhook_secret);
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );
}

async fn re_enabling_with_leave_suspended_sends_nothing_until_redelivered(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(410)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let (reply, suspended) = a_suspended_callback(&db, &server, &tenant, &receiver).await;
    let id = suspended["id"].as_str().unwrap().to_owned();

    let out = db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        &receiver.url,
        "--leave-suspended",
    ]);
    assert!(out.contains("1 callback(s) left suspended"), "{out}");
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 0);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(
        delivery_now(&server, &tenant, &reply).await["status"],
        "suspended"
    );

    // The operator sends the ones wanted, one by one.
    let redelivered = Reply::from(
        server
            .client
            .post(format!("{}/v1/deliveries/{id}/redeliver", server.base))
            .bearer_auth(&tenant.api_key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(redelivered.status, 202, "{}", redelivered.text());
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );
    assert_eq!(receiver.received().len(), 2);
}

async fn four_500s_make_a_delivery_dead_and_redeliver_sends_the_same_webhook_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(500); 4]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900507"))
        .await;
    for _ in 0..3 {
        wait_for_next_round().await;
        assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 1);
    }
    wait_for_next_round().await;
    assert_eq!(
        db.worker_once(&RETRY_INTERVAL)["attempted"],
        0,
        "a dead delivery is not retried"
    );
    let dead = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(dead["status"], "dead");
    assert_eq!(
        dead["attempts"].as_array().unwrap().len(),
        4,
        "1 inline + 3 worker attempts"
    );
    let listed = server
        .get(&tenant, "/v1/deliveries?status=dead")
        .await
        .json();
    assert_eq!(listed["data"][0]["id"], dead["id"]);

    let id = dead["id"].as_str().unwrap();
    let redelivered = Reply::from(
        server
            .client
            .post(format!("{}/v1/deliveries/{id}/redeliver", server.base))
            .bearer_auth(&tenant.api_key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(redelivered.status, 202);
    assert_eq!(redelivered.json()["status"], "succeeded");
    let got = receiver.received();
    assert_eq!(got.len(), 5);
    assert_eq!(got[4].header("webhook-id"), got[0].header("webhook-id"));
    assert_eq!(got[4].body, got[0].body);
    receiver.verify_all_with_python(&tenant.webhook_secret);
}

async fn retry_after_longer_than_the_schedule_is_honoured(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(429).header("retry-after", "3600")]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900508"))
        .await;
    wait_for_next_round().await;
    assert_eq!(
        db.worker_once(&RETRY_INTERVAL)["attempted"],
        0,
        "not due for an hour"
    );
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "pending");
    let next = time::OffsetDateTime::parse(
        d["next_attempt_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(next - time::OffsetDateTime::now_utc() > time::Duration::minutes(55));
}

async fn a_retry_after_past_a_day_is_clamped_to_a_day(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The hardening review's value: a wait no schedule could ever reach.
    let forever = Step::status(503).header("retry-after", "99999999999999999999");
    let receiver = Receiver::start(vec![forever]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900521"))
        .await;
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "pending", "{d}");
    let next = time::OffsetDateTime::parse(
        d["next_attempt_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap_or_else(|e| panic!("next_attempt_at is no time ({e}): {d}"));
    let wait = next - time::OffsetDateTime::now_utc();
    assert!(
        wait > time::Duration::hours(23) && wait <= time::Duration::hours(24),
        "the retry waits {wait}, not at most a day"
    );
}

async fn a_delivery_that_dies_is_logged_at_warn_and_counted(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(500); 4]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    // The server's own worker, retrying every second.
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("VERDICT_RETRY_INTERVAL_SECS", "1"),
        ],
    );
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900522"))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let dead = loop {
        let d = common::deliveries::delivery_now(&server, &tenant, &reply).await;
        if d["status"] == "dead" {
            break d;
        }
        assert!(Instant::now() < deadline, "never dead: {d}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let logs = server.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("delivery is dead"))
        .unwrap_or_else(|| panic!("no dead-letter line in the logs"));
    let line: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(line["level"], "WARN", "{line}");
    assert_eq!(line["delivery_id"], dead["id"], "{line}");
    let metrics = server.metrics().await;
    assert!(
        metrics.contains("verdict_deliveries_dead_total 1"),
        "no dead-letter count:\n{metrics}"
    );
}

async fn redirects_are_not_followed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(302).header("location", "/elsewhere")]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900509"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "failed"
    );
    let paths: Vec<String> = receiver.received().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, vec!["/hook"]);
}

async fn private_destinations_are_refused_unless_allowed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &[("VERDICT_NO_WORKER", "1")]);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900510"))
        .await;
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "failed");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap()
            .contains("destination refused"),
        "{d}"
    );
    assert!(receiver.received().is_empty());

    // A hostname that resolves to loopback is refused by the resolver too.
    let port = receiver
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let by_name = format!("http://localhost:{port}/hook");
    db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        &by_name,
    ]);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900511"))
        .await;
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "failed", "{d}");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap()
            .contains("destination refused"),
        "{d}"
    );
    assert!(receiver.received().is_empty());
}

async fn two_workers_share_500_due_deliveries_and_attempt_each_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    receiver.answer_by_default(Step::status(503));
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let req = common::signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            &tenant,
            Some(&new_key()),
            &sim_swap(&format!("+4477009{i:05}")),
            common::now(),
        );
        tasks.spawn(async move { req.send().await.unwrap().status().as_u16() });
        while tasks.len() >= 16 {
            assert_eq!(tasks.join_next().await.unwrap().unwrap(), 200);
        }
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(receiver.received().len(), 500, "500 inline attempts");
    assert_eq!(db.count("deliveries").await, 500);

    receiver.answer_by_default(Step::slow(200, Duration::from_millis(5)));
    wait_for_next_round().await;
    let workers: Vec<_> = (0..2)
        .map(|_| {
            db.worker_once_command(&RETRY_INTERVAL)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut attempted = Vec::new();
    for w in workers {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success());
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        attempted.push(report["attempted"].as_u64().unwrap());
    }
    assert_eq!(
        attempted.iter().sum::<u64>(),
        500,
        "per worker: {attempted:?}"
    );

    let round: Vec<_> = receiver.received()[500..].to_vec();
    assert_eq!(
        round.len(),
        500,
        "every due delivery attempted once this round"
    );
    let mut ids: Vec<&str> = round.iter().map(|r| r.header("webhook-id")).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 500, "no delivery attempted twice, none skipped");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'succeeded'")
            .await,
        500
    );
}

async fn during_a_webhook_secret_rotation_callbacks_carry_both_signatures(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let rotated = db.cli(&[
        "tenant",
        "rotate-secret",
        "--tenant",
        &tenant.id,
        "--purpose",
        "webhook",
        "--json",
    ]);
    let new_secret = serde_json::from_str::<serde_json::Value>(&rotated).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900512"))
        .await;
    assert_eq!(
        delivery_of(&server, &tenant, &reply).await["status"],
        "succeeded"
    );
    let got = receiver.received();
    assert_eq!(got[0].header("webhook-signature").split(' ').count(), 2);
    // Receivers on either secret accept it, checked by the reference library.
    receiver.verify_all_with_python(&tenant.webhook_secret);
    receiver.verify_all_with_python(&new_secret);
}

/// A retry is due one interval after the inline attempt that failed, which falls between two
/// of the worker's rounds: it goes out when due, not at the round after (which would be up to
/// an interval late).
async fn a_retry_between_two_rounds_goes_out_when_due(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    // Rounds at 0, 4, 8 s after start; the signal at about 2 s is retried at about 6 s.
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("VERDICT_RETRY_INTERVAL_SECS", "4"),
        ],
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900509"))
        .await;
    assert_eq!(reply.status, 200);
    let failed_at = Instant::now();
    assert_eq!(receiver.received().len(), 1, "one inline attempt");
    while receiver.received().len() < 2 && failed_at.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retried_after = failed_at.elapsed();
    assert_eq!(receiver.received().len(), 2, "the worker retried it");
    assert!(
        retried_after >= Duration::from_millis(3800) && retried_after < Duration::from_millis(5300),
        "due 4 s after the inline attempt, retried after {retried_after:?}"
    );
}

/// A callback whose envelope cannot be rendered from its event (here, an event row mangled by
/// hand) does not hold up the others: it is made dead with why, and the rest go out.
async fn a_callback_its_event_cannot_render_is_made_dead_and_the_others_go_out(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503), Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900531"))
        .await;
    let second = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900532"))
        .await;
    assert_eq!((first.status, second.status), (200, 200));
    assert_eq!(
        receiver.received().len(),
        2,
        "two inline attempts, both 503"
    );
    let mangled = first.json()["event_id"].as_str().unwrap().to_owned();
    let id = match db.backend {
        Backend::Sqlite => format!("x'{}'", mangled.replace('-', "")),
        Backend::Postgres => format!("'{mangled}'"),
    };
    assert_eq!(
        db.exec(format!(
            "UPDATE events SET actions = 'Nope' WHERE id = {id}"
        ))
        .await,
        1
    );

    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    let dead = delivery_of(&server, &tenant, &first).await;
    assert_eq!(dead["status"], "dead", "{dead}");
    assert_eq!(
        dead["last_error"],
        "its envelope could not be rendered from its event"
    );
    assert_eq!(
        delivery_of(&server, &tenant, &second).await["status"],
        "succeeded"
    );
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["attempted"], 0);
    assert_eq!(receiver.received().len(), 3);
}

on_both_backends!(
    a_callback_its_event_cannot_render_is_made_dead_and_the_others_go_out,
    a_retry_between_two_rounds_goes_out_when_due,
    during_a_webhook_secret_rotation_callbacks_carry_both_signatures,
    a_receiver_answering_503_twice_then_200_gets_three_identical_deliveries,
    an_inline_attempt_is_recorded_on_its_delivery_and_listed_first,
    a_receiver_that_sleeps_10s_does_not_hold_the_response_past_the_deadline,
    a_400_is_terminal_after_one_attempt,
    a_410_is_terminal_and_disables_the_endpoint_until_re_enabled,
    a_callback_decided_while_the_endpoint_is_disabled_is_sent_once_when_re_enabled,
    re_enabling_with_leave_suspended_sends_nothing_until_redelivered,
    four_500s_make_a_delivery_dead_and_redeliver_sends_the_same_webhook_id,
    retry_after_longer_than_the_schedule_is_honoured,
    a_retry_after_past_a_day_is_clamped_to_a_day,
    a_delivery_that_dies_is_logged_at_warn_and_counted,
    redirects_are_not_followed,
    private_destinations_are_refused_unless_allowed,
    two_workers_share_500_due_deliveries_and_attempt_each_once,
);
