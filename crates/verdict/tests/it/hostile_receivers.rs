//! Hostile callback receivers (issue 10): receivers that hang past the deadline, reset the
//! connection, answer garbage, answer a 50 MB body, redirect to another port, or answer a byte
//! at a time. Every attempt ends within `VERDICT_INLINE_DEADLINE_MS`, is recorded, and is
//! retried or terminal per the rules; the worker attempts them side by side, so one hanging
//! receiver does not hold back another tenant's delivery. Real binary, real sockets, both
//! backends.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::deliveries::delivery_after;
use crate::common::hostile::{Hostile, Hostility};
use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, Server, Tenant, TestDb, new_key, sim_swap};
use serde_json::Value;

/// The attempt deadline of these tests.
const DEADLINE_MS: u64 = 1000;
/// What an attempt may take beyond its deadline: the timer firing, recording, a loaded machine.
const SLACK_MS: u64 = 750;

fn env(deadline_ms: &str) -> [(&str, &str); 4] {
    [
        ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
        ("VERDICT_RETRY_INTERVAL_SECS", "1"),
        ("VERDICT_NO_WORKER", "1"),
        ("VERDICT_INLINE_DEADLINE_MS", deadline_ms),
    ]
}

/// One hostile receiver and what the rules make of it.
struct Case {
    name: &'static str,
    receiver: Hostile,
    /// The delivery's status after the inline attempt: `pending` (retried) or terminal.
    after_inline: &'static str,
    /// Whether the attempt got an HTTP status at all.
    status_code: Option<u64>,
}

async fn every_hostile_answer_ends_within_the_deadline_and_is_recorded_and_classified(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    // A second loopback port the redirect points at: it must never be asked.
    let elsewhere = Receiver::start(vec![]).await;
    let byte_every = Duration::from_millis(150);
    let cases = [
        Case {
            name: "hangs past the deadline",
            receiver: Hostile::start(Hostility::Hang).await,
            after_inline: "pending",
            status_code: None,
        },
        Case {
            name: "resets the connection",
            receiver: Hostile::start(Hostility::Reset).await,
            after_inline: "pending",
            status_code: None,
        },
        Case {
            name: "answers garbage",
            receiver: Hostile::start(Hostility::Garbage).await,
            after_inline: "pending",
            status_code: None,
        },
        Case {
            name: "answers a 50 MB body",
            receiver: Hostile::start(Hostility::HugeBody(50 * 1024 * 1024)).await,
            after_inline: "succeeded",
            status_code: Some(200),
        },
        Case {
            name: "redirects to another loopback port",
            receiver: Hostile::start(Hostility::Redirect(elsewhere.url.clone())).await,
            after_inline: "failed",
            status_code: Some(302),
        },
        Case {
            name: "answers a byte at a time",
            receiver: Hostile::start(Hostility::Trickle(byte_every)).await,
            after_inline: "pending",
            status_code: None,
        },
        Case {
            name: "answers its body a byte at a time",
            receiver: Hostile::start(Hostility::TrickleBody(byte_every)).await,
            after_inline: "succeeded",
            status_code: Some(200),
        },
    ];
    let deadline = DEADLINE_MS.to_string();
    let server = Server::start(&db, &env(&deadline));
    let limit = Duration::from_millis(DEADLINE_MS + SLACK_MS);

    // The inline attempts: every response within the deadline, every attempt recorded.
    let mut sent = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let tenant = db.tenant(&["--callback-url", &case.receiver.url]);
        let started = Instant::now();
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap(&format!("+4477009007{i:02}")),
            )
            .await;
        let took = started.elapsed();
        assert_eq!(reply.status, 200, "{}", case.name);
        assert!(took < limit, "{}: the signal took {took:?}", case.name);
        sent.push((tenant, reply));
    }
    let mut retried = 0;
    for (case, (tenant, reply)) in cases.iter().zip(&sent) {
        let d = delivery_after(&server, tenant, reply, 1).await;
        let attempt = &d["attempts"][0];
        eprintln!(
            "{backend:?}: receiver {}: {} after {} ms ({}), error {}",
            case.name, d["status"], attempt["latency_ms"], attempt["status_code"], attempt["error"]
        );
        assert_eq!(d["status"], case.after_inline, "{}: {d}", case.name);
        assert_eq!(attempt["trigger"], "inline", "{}", case.name);
        assert_eq!(
            attempt["status_code"].as_u64(),
            case.status_code,
            "{}",
            case.name
        );
        assert!(
            attempt["latency_ms"].as_u64().unwrap() <= DEADLINE_MS + SLACK_MS,
            "{}: {attempt}",
            case.name
        );
        // At most the 1 KiB excerpt is kept, however much the receiver sent.
        let excerpt = attempt["response"].as_str().unwrap_or_default();
        assert!(
            excerpt.len() <= 1024,
            "{}: {} bytes",
            case.name,
            excerpt.len()
        );
        if case.after_inline == "pending" {
            assert!(attempt["error"].is_string(), "{}: {attempt}", case.name);
            assert!(d["next_attempt_at"].is_string(), "{}", case.name);
            retried += 1;
        }
    }
    let huge = &cases[3].receiver;
    eprintln!(
        "{backend:?}: the 50 MB receiver got {} bytes out before the connection closed",
        huge.written()
    );
    assert!(
        huge.written() < 16 * 1024 * 1024,
        "the 50 MB body was read, not cut off: {} bytes went out",
        huge.written()
    );
    assert!(elsewhere.received().is_empty(), "the redirect was followed");

    // One worker round: the retryable ones again, side by side (the round takes one deadline,
    // not one per receiver), the terminal and delivered ones not at all.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    let round = db.worker_once(&env(&deadline));
    let took = started.elapsed();
    eprintln!("{backend:?}: worker round {round} in {took:?}");
    assert_eq!(round["attempted"], retried, "{round}");
    assert_eq!(round["delivered"], 0, "{round}");
    assert!(
        took < Duration::from_millis(2 * DEADLINE_MS + 2 * SLACK_MS),
        "the round waited on its receivers one after another: {took:?}"
    );
    for (case, (tenant, reply)) in cases.iter().zip(&sent) {
        let expected = if case.after_inline == "pending" { 2 } else { 1 };
        let d = delivery_after(&server, tenant, reply, expected).await;
        let attempts = d["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), expected, "{}: {d}", case.name);
        if expected == 2 {
            assert_eq!(attempts[1]["trigger"], "worker", "{}", case.name);
            assert!(
                attempts[1]["latency_ms"].as_u64().unwrap() <= DEADLINE_MS + SLACK_MS,
                "{}: {}",
                case.name,
                attempts[1]
            );
            assert_eq!(d["status"], "pending", "{}: retries remain", case.name);
        }
        let connections = case.receiver.arrivals().len();
        assert_eq!(connections, expected, "{}: connections", case.name);
    }
    assert!(elsewhere.received().is_empty(), "the redirect was followed");
    assert!(!server.logs().contains("panicked"));
}

/// Runs one `worker --once` round (for at most `limit`), watching `healthy` for its second
/// request: the round's report, when the retry arrived, and how long the round took.
async fn watched_round(
    db: &TestDb,
    env: &[(&str, &str)],
    healthy: &Receiver,
    limit: Duration,
) -> (Value, Duration, Duration) {
    let started = Instant::now();
    let mut worker = db
        .worker_once_command(env)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut delivered_after = None;
    while started.elapsed() < limit {
        if delivered_after.is_none() && healthy.received().len() == 2 {
            delivered_after = Some(started.elapsed());
        }
        if worker.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let round_took = started.elapsed();
    let out = worker.wait_with_output().unwrap();
    let round: Value = serde_json::from_slice(&out.stdout).unwrap();
    let delivered_after =
        delivered_after.expect("the healthy receiver got no retry in the worker's round");
    (round, delivered_after, round_took)
}

/// Two tenants on one server with a worker-less `deadline_ms`: one whose callbacks go to a
/// receiver that hangs, one whose go to a receiver that answers 503 once, then 200.
struct TwoTenants {
    // Fields drop in this order: the server before its database.
    server: Server,
    hostile_tenant: Tenant,
    tenant: Tenant,
    healthy: Receiver,
    _hanging: Hostile,
    db: TestDb,
    deadline: String,
}

impl TwoTenants {
    async fn start(backend: Backend, deadline_ms: u64) -> Self {
        let db = TestDb::new(backend).await;
        let hanging = Hostile::start(Hostility::Hang).await;
        let healthy = Receiver::start(vec![Step::status(503)]).await;
        let hostile_tenant = db.tenant(&["--callback-url", &hanging.url]);
        let tenant = db.tenant(&["--callback-url", &healthy.url]);
        let deadline = deadline_ms.to_string();
        let server = Server::start(&db, &env(&deadline));
        Self {
            server,
            hostile_tenant,
            tenant,
            healthy,
            _hanging: hanging,
            db,
            deadline,
        }
    }

    fn env(&self) -> [(&str, &str); 4] {
        env(&self.deadline)
    }
}

async fn a_hanging_receiver_does_not_hold_back_another_tenants_delivery_in_the_same_round(
    backend: Backend,
) {
    // A longer deadline, so "at once" and "after the deadline" are far apart.
    const DEADLINE_MS: u64 = 4000;
    let two = TwoTenants::start(backend, DEADLINE_MS).await;
    let (db, healthy, env, server) = (&two.db, &two.healthy, two.env(), &two.server);
    let (hostile_tenant, tenant) = (&two.hostile_tenant, &two.tenant);
    // Both inline attempts fail (the hang at the deadline, the other with a 503): both due in
    // the next round.
    let hung = server
        .send(hostile_tenant, Some(&new_key()), &sim_swap("+447700900801"))
        .await;
    let refused = server
        .send(tenant, Some(&new_key()), &sim_swap("+447700900802"))
        .await;
    assert_eq!(hung.status, 200);
    assert_eq!(refused.status, 200);
    delivery_after(server, hostile_tenant, &hung, 1).await;
    assert_eq!(healthy.received().len(), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let (round, delivered_after, round_took) =
        watched_round(db, &env, healthy, Duration::from_millis(DEADLINE_MS + 5000)).await;
    eprintln!(
        "{backend:?}: healthy tenant delivered {delivered_after:?} into the round, round took \
         {round_took:?}: {round}"
    );
    assert_eq!(round["attempted"], 2, "{round}");
    assert_eq!(round["delivered"], 1, "{round}");
    // The hanging attempt runs to its deadline; the healthy one does not wait for it (the
    // worker process's own start-up is most of what it waits).
    assert!(
        delivered_after < Duration::from_millis(DEADLINE_MS / 2),
        "the healthy delivery waited on the hanging one: {delivered_after:?}"
    );
    assert!(
        round_took >= Duration::from_millis(DEADLINE_MS),
        "{round_took:?}"
    );
    assert!(
        round_took < Duration::from_millis(DEADLINE_MS + 3000),
        "the round overran the deadline: {round_took:?}"
    );
    assert_eq!(
        delivery_after(server, tenant, &refused, 2).await["status"],
        "succeeded"
    );
    let d = delivery_after(server, hostile_tenant, &hung, 2).await;
    assert_eq!(d["status"], "pending", "{d}");
    assert!(d["attempts"][1]["latency_ms"].as_u64().unwrap() <= DEADLINE_MS + SLACK_MS);
}

async fn a_tenant_with_more_hanging_deliveries_than_slots_does_not_hold_back_another_tenant(
    backend: Backend,
) {
    // More hanging deliveries than the worker has slots (16), all due before the other
    // tenant's: a worker that filled every slot with them would make the other wait a deadline.
    const DEADLINE_MS: u64 = 2500;
    const HANGING: usize = 18;
    let two = TwoTenants::start(backend, DEADLINE_MS).await;
    let (db, healthy, env, server) = (&two.db, &two.healthy, two.env(), &two.server);
    let (hostile_tenant, tenant) = (&two.hostile_tenant, &two.tenant);
    let hung: Vec<_> = (0..HANGING)
        .map(|i| {
            let (base, client, tenant) = (
                server.base.clone(),
                server.client.clone(),
                hostile_tenant.clone(),
            );
            tokio::spawn(async move {
                let req = common::signed(
                    client.post(format!("{base}/v1/signals")),
                    &tenant,
                    Some(&new_key()),
                    &sim_swap(&format!("+4477009008{i:02}")),
                    common::now(),
                );
                common::Reply::from(req.send().await.unwrap()).await
            })
        })
        .collect();
    for reply in hung {
        assert_eq!(reply.await.unwrap().status, 200);
    }
    let refused = server
        .send(tenant, Some(&new_key()), &sim_swap("+447700900899"))
        .await;
    assert_eq!(refused.status, 200);
    assert_eq!(healthy.received().len(), 1);
    // Every inline attempt is recorded (the hanging ones at their deadline) and due next round.
    tokio::time::sleep(Duration::from_millis(DEADLINE_MS + 1100)).await;

    let (round, delivered_after, _) = watched_round(
        db,
        &env,
        healthy,
        Duration::from_millis(4 * DEADLINE_MS + 5000),
    )
    .await;
    eprintln!("{backend:?}: healthy tenant delivered {delivered_after:?} into the round: {round}");
    assert_eq!(round["attempted"], HANGING + 1, "{round}");
    assert_eq!(round["delivered"], 1, "{round}");
    assert!(
        delivered_after < Duration::from_millis(DEADLINE_MS / 2),
        "the healthy delivery waited behind the hanging ones: {delivered_after:?}"
    );
}

on_both_backends!(
    every_hostile_answer_ends_within_the_deadline_and_is_recorded_and_classified,
    a_hanging_receiver_does_not_hold_back_another_tenants_delivery_in_the_same_round,
    a_tenant_with_more_hanging_deliveries_than_slots_does_not_hold_back_another_tenant,
);
