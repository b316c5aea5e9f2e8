//! Delivery hardening against real receivers on 127.0.0.1: no callback leaves unsigned, a token
//! in the callback URL never reaches stored errors or logs, and redelivery is rate limited per
//! delivery across instances and the CLI.

use std::time::Duration;

use crate::common::deliveries::{delivery_after, delivery_of, wait_for_next_round};
use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Reply, Server, Tenant, TestDb, new_key, sim_swap};

const RETRY_INTERVAL: [(&str, &str); 1] = [("VERDICT_RETRY_INTERVAL_SECS", "1")];

async fn with_every_webhook_secret_retired_nothing_goes_out_unsigned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    db.exec("UPDATE tenant_secrets SET retired_at = 1 WHERE purpose = 'webhook'")
        .await;
    let server = Server::start(&db, &MANUAL_WORKER);

    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900801"))
        .await;
    assert_eq!(reply.status, 200);
    let d = delivery_after(&server, &tenant, &reply, 1).await;
    let attempt = &d["attempts"][0];
    assert!(
        attempt["error"]
            .as_str()
            .unwrap()
            .contains("no live webhook secret"),
        "{d}"
    );
    assert_eq!(attempt["status_code"], serde_json::Value::Null);
    assert_eq!(
        d["status"], "pending",
        "retried: a secret may be issued meanwhile"
    );

    // The worker's retry finds no secret either, and sends nothing.
    wait_for_next_round().await;
    let round = db.worker_once(&RETRY_INTERVAL);
    assert_eq!(
        (round["attempted"].as_i64(), round["delivered"].as_i64()),
        (Some(1), Some(0))
    );
    assert!(receiver.received().is_empty(), "nothing left unsigned");

    // Once a secret is issued, the next retry goes out signed with it.
    let rotated = db.cli(&[
        "tenant",
        "rotate-secret",
        "--tenant",
        &tenant.id,
        "--purpose",
        "webhook",
        "--json",
    ]);
    let secret = serde_json::from_str::<serde_json::Value>(&rotated).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    wait_for_next_round().await;
    assert_eq!(db.worker_once(&RETRY_INTERVAL)["delivered"], 1);
    let got = receiver.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("webhook-signature").split(' ').count(), 1);
    receiver.verify_all_with_python(&secret);
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "succeeded", "{d}");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 3);
}

async fn a_token_in_the_callback_url_never_reaches_stored_errors_or_logs(backend: Backend) {
    let db = TestDb::new(backend).await;
    // A receiver slower than the deadline, and a closed port: the two errors that quote the URL.
    let receiver = Receiver::start(vec![Step::slow(200, Duration::from_secs(5))]).await;
    let slow = format!("{}?token=s3cret&sig=t0psecret#frag1", receiver.url);
    let closed = "http://alice:pa55word@127.0.0.1:9/cb?token=s3cret";
    let tenant = db.tenant(&["--callback-url", &slow]);
    let mut env = MANUAL_WORKER.to_vec();
    env.push(("VERDICT_INLINE_DEADLINE_MS", "300"));
    let server = Server::start(&db, &env);

    let timed_out = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900802"))
        .await;
    let d = delivery_after(&server, &tenant, &timed_out, 1).await;
    let error = d["attempts"][0]["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("/hook"),
        "the URL without its query: {error}"
    );

    db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        closed,
    ]);
    let refused = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900803"))
        .await;
    let d = delivery_after(&server, &tenant, &refused, 1).await;
    let error = d["attempts"][0]["error"].as_str().unwrap().to_owned();
    assert!(error.contains("127.0.0.1:9/cb"), "{error}");

    for body in [
        &delivery_of(&server, &tenant, &timed_out).await,
        &delivery_of(&server, &tenant, &refused).await,
    ] {
        let text = body.to_string();
        for secret in ["s3cret", "t0psecret", "frag1", "pa55word", "alice"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
    assert_eq!(
        db.scalar(
            "SELECT (SELECT COUNT(*) FROM delivery_attempts WHERE error LIKE '%s3cret%' \
             OR error LIKE '%t0psecret%' OR error LIKE '%frag1%' OR error LIKE '%pa55word%') \
             + (SELECT COUNT(*) FROM deliveries WHERE inline_error LIKE '%s3cret%' \
             OR inline_error LIKE '%t0psecret%' OR inline_error LIKE '%frag1%' \
             OR inline_error LIKE '%pa55word%')"
        )
        .await,
        0
    );
    assert_eq!(
        db.scalar(
            "SELECT COUNT(*) FROM deliveries WHERE last_error LIKE '%s3cret%' \
             OR last_error LIKE '%pa55word%'"
        )
        .await,
        0
    );
    assert_eq!(db.count("delivery_attempts").await, 2);
    let logs = server.logs();
    assert!(logs.contains("delivery attempted"), "the logs were read");
    for secret in ["s3cret", "t0psecret", "pa55word"] {
        assert!(!logs.contains(secret), "{secret} in the logs");
    }
}

async fn redeliver(server: &Server, tenant: &Tenant, id: &str) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}/v1/deliveries/{id}/redeliver", server.base))
            .bearer_auth(&tenant.api_key)
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn redeliver_is_limited_to_once_per_delivery_every_10_s_across_instances(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let one = Server::start(&db, &MANUAL_WORKER);
    let other = Server::start(&db, &MANUAL_WORKER);
    let reply = one
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900804"))
        .await;
    let id = delivery_of(&one, &tenant, &reply).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    assert_eq!(redeliver(&one, &tenant, &id).await.status, 202);
    // Again at once, on another instance sharing the database: refused, with when to retry.
    for server in [&other, &one] {
        let refused = redeliver(server, &tenant, &id).await;
        assert_eq!(refused.status, 429);
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(
            refused.json()["type"],
            "https://verdict.dev/problems/rate-limited"
        );
        let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=10).contains(&wait), "Retry-After: {wait}");
    }
    // And from the CLI.
    let out = db.cli_output(
        &["deliveries", "redeliver", "--tenant", &tenant.id, &id],
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("at most one redelivery per delivery every 10 s"),
        "{stderr}"
    );
    assert_eq!(
        receiver.received().len(),
        2,
        "the inline attempt and one redelivery"
    );

    // Ten seconds later (the recorded redelivery back-dated), it is allowed again, once.
    db.exec(
        "UPDATE delivery_attempts SET attempted_at = attempted_at - 10000 \
         WHERE trigger_kind = 'redeliver'",
    )
    .await;
    db.cli(&["deliveries", "redeliver", "--tenant", &tenant.id, &id]);
    assert_eq!(receiver.received().len(), 3);
    assert_eq!(redeliver(&other, &tenant, &id).await.status, 429);

    // The limit is per delivery: another one is redelivered at once.
    let second = one
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900805"))
        .await;
    let second_id = delivery_of(&one, &tenant, &second).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(redeliver(&other, &tenant, &second_id).await.status, 202);
    let mut triggers = delivery_of(&one, &tenant, &reply).await["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["trigger"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>();
    triggers.sort();
    assert_eq!(triggers, ["inline", "redeliver", "redeliver"]);
}

on_both_backends!(
    redeliver_is_limited_to_once_per_delivery_every_10_s_across_instances,
    with_every_webhook_secret_retired_nothing_goes_out_unsigned,
    a_token_in_the_callback_url_never_reaches_stored_errors_or_logs,
);
