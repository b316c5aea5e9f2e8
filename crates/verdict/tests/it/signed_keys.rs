//! Signatures that cover the idempotency key: `Verdict-Signature: v2` and Standard Webhooks
//! (signed by the reference library of others), so bytes captured in flight cannot be sent
//! again under a new key to make a new event.

use std::process::Command;

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};

fn post(server: &Server) -> reqwest::RequestBuilder {
    server.client.post(format!("{}/v1/signals", server.base))
}

/// `Verdict-Signature` with the `v1` entry alone, over `"{timestamp}.{body}"`.
fn signed_v1_only(
    req: reqwest::RequestBuilder,
    tenant: &Tenant,
    key: &str,
    body: &str,
    timestamp: i64,
) -> reqwest::RequestBuilder {
    let secret = verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap();
    req.bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .header("verdict-timestamp", timestamp.to_string())
        .header(
            "verdict-signature",
            secret.sign_content(format!("{timestamp}.{body}").as_bytes()),
        )
        .body(body.to_owned())
}

/// The `webhook-signature` the Python `standardwebhooks` library (PyPI) makes.
fn standard_webhooks_signature(secret: &str, id: &str, timestamp: i64, body: &str) -> String {
    let script = "import sys, datetime\n\
        from standardwebhooks.webhooks import Webhook\n\
        ts = datetime.datetime.fromtimestamp(int(sys.argv[3]), tz=datetime.timezone.utc)\n\
        print(Webhook(sys.argv[1]).sign(sys.argv[2], ts, sys.stdin.read()))\n";
    let mut child = Command::new("python3")
        .args(["-c", script, secret, id, &timestamp.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with standardwebhooks (scripts/test installs it)");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the reference library failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A Standard Webhooks request: `webhook-id`, `webhook-timestamp`, `webhook-signature`.
fn standard(
    server: &Server,
    tenant: &Tenant,
    id: &str,
    timestamp: i64,
    signature: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    post(server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(body.to_owned())
}

async fn sent(req: reqwest::RequestBuilder) -> Reply {
    Reply::from(req.send().await.unwrap()).await
}

fn assert_refused(reply: &Reply, status: u16, problem: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    assert_eq!(
        reply.json()["type"],
        format!("https://verdict.dev/problems/{problem}"),
        "{what}"
    );
}

async fn signed_bytes_sent_again_under_a_new_key_make_no_new_event(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900801");
    let ts = now();
    let first = sent(signed(post(&server), &tenant, Some("key-1"), &body, ts)).await;
    assert_eq!(first.status, 200, "{}", first.text());

    // The captured headers and bytes under five new keys: the v2 entry signed key-1, and the
    // v1 entry beside it covers no key, which this tenant does not take.
    for n in 2..=6 {
        let secret = verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap();
        let captured = format!(
            "{} {}",
            secret.sign_content_as("v2", format!("{ts}.key-1.{body}").as_bytes()),
            secret.sign_content(format!("{ts}.{body}").as_bytes())
        );
        let replay = post(&server)
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/json")
            .header("idempotency-key", format!("key-{n}"))
            .header("verdict-timestamp", ts.to_string())
            .header("verdict-signature", captured)
            .body(body.clone());
        let reply = sent(replay).await;
        assert_refused(&reply, 401, "invalid-signature", "replayed under a new key");
        assert!(
            reply.json()["detail"]
                .as_str()
                .is_some_and(|d| d.contains("covers the idempotency key")),
            "{}",
            reply.text()
        );
    }
    assert_eq!(db.count("events").await, 1, "a replay made a new event");

    // A v1 signature alone is refused, however fresh; after `require-signed-keys --off` (a
    // tenant whose senders cannot sign the key yet) it is taken again.
    let v1 = sent(signed_v1_only(
        post(&server),
        &tenant,
        &new_key(),
        &body,
        now(),
    ))
    .await;
    assert_refused(&v1, 401, "invalid-signature", "v1 alone");
    db.cli(&[
        "tenant",
        "require-signed-keys",
        "--tenant",
        &tenant.id,
        "--off",
    ]);
    let restarted = Server::start(&db, &[]);
    let v1 = sent(signed_v1_only(
        post(&restarted),
        &tenant,
        &new_key(),
        &sim_swap("+447700900802"),
        now(),
    ))
    .await;
    assert_eq!(v1.status, 200, "{}", v1.text());
}

async fn a_signal_signed_by_the_standard_webhooks_library_is_taken_once_under_its_id(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let body = sim_swap("+447700900811");
    let id = format!("msg_{}", new_key());
    let ts = now();
    let signature = standard_webhooks_signature(&tenant.signing_secret, &id, ts, &body);
    assert!(signature.starts_with("v1,"), "{signature}");

    let first = sent(standard(&server, &tenant, &id, ts, &signature, &body)).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(!first.replayed());
    // `webhook-id` is the idempotency key: the same message again is the same decision.
    let again = sent(standard(&server, &tenant, &id, ts, &signature, &body)).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    // An Idempotency-Key beside it must be the same key.
    let same =
        sent(standard(&server, &tenant, &id, ts, &signature, &body).header("idempotency-key", &id))
            .await;
    assert!(same.replayed(), "{}", same.text());
    let other =
        standard(&server, &tenant, &id, ts, &signature, &body).header("idempotency-key", "another");
    assert_refused(
        &sent(other).await,
        400,
        "invalid-idempotency-key",
        "another key beside it",
    );

    // The signature covers the id: the captured bytes under a new id are refused.
    let new_id = sent(standard(&server, &tenant, "msg_new", ts, &signature, &body)).await;
    assert_refused(&new_id, 401, "invalid-signature", "a new webhook-id");
    // Tampered, stale and unsigned ones are refused too.
    let tampered = body.replacen("+447700900811", "+447700900812", 1);
    let reply = sent(standard(&server, &tenant, &id, ts, &signature, &tampered)).await;
    assert_refused(&reply, 401, "invalid-signature", "tampered");
    let old = ts - 301;
    let stale_signature =
        standard_webhooks_signature(&tenant.signing_secret, "msg_old", old, &body);
    let reply = sent(standard(
        &server,
        &tenant,
        "msg_old",
        old,
        &stale_signature,
        &body,
    ))
    .await;
    assert_refused(&reply, 401, "stale-timestamp", "stale");
    let unsigned = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("webhook-id", "msg_unsigned")
        .body(body.clone());
    assert_refused(&sent(unsigned).await, 401, "invalid-signature", "unsigned");
    assert_eq!(db.count("events").await, 1);
}

/// The README's example in `lang` under "From any language", as printed.
fn readme_example(lang: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split("### From any language")
        .nth(1)
        .expect("the README's Standard Webhooks section");
    section
        .lines()
        .skip_while(|l| *l != format!("```{lang}"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect()
}

async fn the_readmes_python_example_sends_a_signal_verdict_takes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let script = readme_example("python").replace("http://127.0.0.1:8080", &server.base);
    assert!(script.contains("Webhook("), "{script}");
    let out = Command::new("python3")
        .args(["-c", &script])
        .env("VERDICT_SIGNING_SECRET", &tenant.signing_secret)
        .env("VERDICT_API_KEY", &tenant.api_key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        db.count("events").await,
        1,
        "the example's signal was not taken"
    );
}

on_both_backends!(
    the_readmes_python_example_sends_a_signal_verdict_takes,
    signed_bytes_sent_again_under_a_new_key_make_no_new_event,
    a_signal_signed_by_the_standard_webhooks_library_is_taken_once_under_its_id,
);
