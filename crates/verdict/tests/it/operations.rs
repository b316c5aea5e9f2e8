//! How the binary treats its operator: a readable master-key file is refused with the fix,
//! logs written to a file carry no terminal colour codes, and `/metrics` says where a
//! signal's time went.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, Server, TestDb};

#[test]
fn serve_refuses_a_master_key_file_others_can_read() {
    let dir = std::env::temp_dir().join(format!("verdict-key-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("verdict.db");
    let key_file = dir.join("verdict.db.master-key");
    std::fs::write(&key_file, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("VERDICT_DATABASE_URL", format!("sqlite://{}", db.display()))
        .env_remove("VERDICT_MASTER_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "serve started with a world-readable key: {stderr}"
    );
    assert!(
        stderr.contains(&format!("chmod 600 {}", key_file.display())),
        "the error names the file and the fix: {stderr}"
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["tenant", "create", "--name", "ok", "--json"])
        .env("VERDICT_DATABASE_URL", format!("sqlite://{}", db.display()))
        .env_remove("VERDICT_MASTER_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

async fn logs_to_a_pipe_carry_no_colour_codes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[("VERDICT_LOG_FORMAT", "text")]);
    let reply = server
        .client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let logs = server.logs();
    assert!(logs.contains("listening on"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escape codes in logs: {logs:?}"
    );
}

async fn a_master_key_the_database_was_not_set_up_with_is_refused_at_start(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Set up under the test's key: a tenant with sealed secrets.
    let tenant = db.tenant(&[]);
    let other = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [7u8; 32]);
    let wrong = [("VERDICT_MASTER_KEY", other.as_str())];
    for args in [
        &["serve", "--listen", "127.0.0.1:0"][..],
        &["worker", "--once"][..],
        &["tenant", "create", "--name", "another", "--json"][..],
        &["connector", "list", "--tenant", &tenant.id][..],
    ] {
        let out = db.cli_output(args, &wrong);
        assert!(!out.status.success(), "{args:?} started with the wrong key");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not the one the database was set up with"),
            "{args:?}: {err}"
        );
        assert!(!err.contains(&other), "the key is printed: {err}");
    }
    // The right key still starts, and the tenant's secrets still open.
    let server = Server::start(&db, &[]);
    let reply = server
        .send(
            &tenant,
            Some(&crate::common::new_key()),
            &crate::common::sim_swap("+447700900777"),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

async fn a_database_from_before_sentinels_refuses_a_wrong_key_and_stores_none(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    // A database upgraded from a version without sentinels: tenants, sealed secrets, no sentinel.
    db.exec("DELETE FROM master_key_sentinel").await;
    let other = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [9u8; 32]);
    let out = db.cli_output(
        &["tenant", "create", "--name", "another", "--json"],
        &[("VERDICT_MASTER_KEY", other.as_str())],
    );
    assert!(!out.status.success(), "started with the wrong key");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not the one the database was set up with"),
        "{err}"
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM master_key_sentinel").await,
        0,
        "a wrong key's sentinel was stored"
    );
    // The key the secrets were sealed under starts, and its sentinel is stored then.
    let server = Server::start(&db, &[]);
    let reply = server
        .send(
            &tenant,
            Some(&crate::common::new_key()),
            &crate::common::sim_swap("+447700900778"),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM master_key_sentinel").await,
        1
    );
}

async fn metrics_need_the_configured_token(backend: Backend) {
    let db = TestDb::new(backend).await;
    let token = "m".repeat(40);
    let server = Server::start(&db, &[("VERDICT_METRICS_TOKEN", token.as_str())]);
    let get = |bearer: Option<&str>| {
        let mut req = server.client.get(format!("{}/metrics", server.base));
        if let Some(bearer) = bearer {
            req = req.bearer_auth(bearer);
        }
        req.send()
    };
    for bearer in [None, Some("wrong"), Some(&token[1..])] {
        let reply = crate::common::Reply::from(get(bearer).await.unwrap()).await;
        assert_eq!(reply.status, 401, "{bearer:?}: {}", reply.text());
        assert_eq!(
            reply.json()["type"],
            "https://verdict.dev/problems/invalid-metrics-token"
        );
    }
    let reply = get(Some(&token)).await.unwrap();
    assert_eq!(reply.status(), 200);
    assert!(
        reply.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    // Without a token configured, as before, it is open; a token too short to guess-proof
    // stops the server at start.
    let open = Server::start(&db, &[]);
    let reply = open
        .client
        .get(format!("{}/metrics", open.base))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let out = db.cli_output(
        &["serve", "--listen", "127.0.0.1:0"],
        &[("VERDICT_METRICS_TOKEN", "short")],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("VERDICT_METRICS_TOKEN"));
}

/// The sample a Prometheus text exposition gives for `series` (its name and labels as
/// written), if it has one.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn metrics_time_each_phase_of_a_signal(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(204)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &crate::common::MANUAL_WORKER);
    let reply = server
        .send(
            &tenant,
            Some(&crate::common::new_key()),
            &crate::common::sim_swap("+447700900779"),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let metrics = server.metrics().await;
    // One signal: one decision, one commit waited for, one round of inline attempts, each
    // taking some time; and at least its act's batch committed.
    for phase in ["decide", "commit", "inline"] {
        let count = format!("verdict_ingest_phase_seconds_count{{phase=\"{phase}\"}}");
        let sum = format!("verdict_ingest_phase_seconds_sum{{phase=\"{phase}\"}}");
        assert_eq!(sample(&metrics, &count), Some(1.0), "{phase}:\n{metrics}");
        assert!(
            sample(&metrics, &sum).is_some_and(|s| s > 0.0 && s < 30.0),
            "{phase}:\n{metrics}"
        );
    }
    assert!(
        sample(&metrics, "verdict_group_commit_seconds_count").is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    assert_eq!(
        receiver.received().len(),
        1,
        "the inline attempt was not made"
    );
}

on_both_backends!(
    metrics_time_each_phase_of_a_signal,
    metrics_need_the_configured_token,
    logs_to_a_pipe_carry_no_colour_codes,
    a_master_key_the_database_was_not_set_up_with_is_refused_at_start,
    a_database_from_before_sentinels_refuses_a_wrong_key_and_stores_none,
);
