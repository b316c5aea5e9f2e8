//! The CLI a new user reaches for: `--tenant` from the environment `tenant create --env`
//! exports, tenants listed and shown, `--json` beside a format for people, a send retried by
//! hand under its key, and the server's problem detail in a refusal.

use serde_json::Value;

use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Server, TestDb, new_key, sim_swap};

/// The `export` lines of `tenant create --env`, as (name, value).
fn exports(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('\'').to_owned()))
        .collect()
}

async fn tenants_are_listed_and_shown_and_tenant_defaults_to_the_exported_id(backend: Backend) {
    let db = TestDb::new(backend).await;
    let first = db.tenant(&[]);
    let env = exports(&db.cli(&[
        "tenant",
        "create",
        "--name",
        "second",
        "--env",
        "--callback-url",
        "http://127.0.0.1:9/hook",
    ]));
    let id = &env
        .iter()
        .find(|(k, _)| k == "VERDICT_TENANT_ID")
        .unwrap()
        .1;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();

    let listed: Value = serde_json::from_str(&db.cli(&["tenant", "list", "--json"])).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&first.id.as_str()) && ids.contains(&id.as_str()),
        "{listed}"
    );
    let text = db.cli(&["tenant", "list"]);
    assert!(
        text.contains("second") && text.contains("http://127.0.0.1:9/hook"),
        "{text}"
    );
    for secret in [&first.api_key, &first.signing_secret, &first.webhook_secret] {
        assert!(!text.contains(secret.as_str()) && !listed.to_string().contains(secret.as_str()));
    }

    // No --tenant: the exported VERDICT_TENANT_ID is the one.
    let shown = db.cli_output(&["tenant", "show", "--json"], &env);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["tenant_id"], id.as_str());
    assert_eq!(shown["name"], "second");
    assert_eq!(shown["callback_enabled"], true);
    let playbook = db.cli_output(&["playbook", "show"], &env);
    assert!(
        playbook.status.success(),
        "{}",
        String::from_utf8_lossy(&playbook.stderr)
    );
    let text = db.cli(&["tenant", "show", "--tenant", &first.id]);
    assert!(text.contains("inbound signature required    yes"), "{text}");

    let missing = db.cli_output(&["tenant", "show"], &[]);
    assert!(!missing.status.success(), "no tenant, no id: refused");
}

async fn a_send_retried_by_hand_under_its_key_gets_the_first_answer(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &[]);
    let file = db.dir().join("signal.json");
    std::fs::write(&file, sim_swap("+447700900611")).unwrap();
    let key = new_key();
    let send = |key: &str| {
        db.cli_output(
            &["send", file.to_str().unwrap(), "--idempotency-key", key],
            &[
                ("VERDICT_URL", &server.base),
                ("VERDICT_API_KEY", &tenant.api_key),
            ],
        )
    };
    let first = send(&key);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let again = send(&key);
    assert!(again.status.success());
    assert_eq!(first.stdout, again.stdout, "the same decision, replayed");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM events").await, 1);

    // Another body under the same key: the error names the bug and the server's detail.
    std::fs::write(&file, sim_swap("+447700900612")).unwrap();
    let reused = send(&key);
    assert!(!reused.status.success());
    let err = String::from_utf8_lossy(&reused.stderr);
    assert!(err.contains("key-generation bug"), "{err}");

    // A refusal carries the problem's detail, which says what was wrong.
    std::fs::write(&file, r#"{"type":"sim_swap","subject":{}}"#).unwrap();
    let invalid = send(&new_key());
    assert!(!invalid.status.success());
    let err = String::from_utf8_lossy(&invalid.stderr);
    assert!(
        err.contains("400") && err.contains("`observed_at` is required"),
        "{err}"
    );

    // A key outside the grammar (a space or a line break is not visible ASCII, 256 characters
    // are too many) is refused before anything is sent, with the rule it broke.
    std::fs::write(&file, sim_swap("+447700900613")).unwrap();
    for bad in ["two words", "line\nbreak", &"k".repeat(256)] {
        let refused = send(bad);
        assert!(!refused.status.success(), "{bad:?}");
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("invalid idempotency key") && err.contains("1 to 255 visible ASCII"),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM events").await, 1);
}

async fn deliveries_show_when_each_attempt_was_made_and_when_the_next_is_due(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900613"))
        .await;
    assert_eq!(reply.status, 200);
    let event = reply.json()["event_id"].as_str().unwrap().to_owned();
    let listed: Value =
        serde_json::from_str(&db.cli(&["deliveries", "list", "--tenant", &tenant.id, "--json"]))
            .unwrap();
    let delivery = listed[0]["id"].as_str().unwrap().to_owned();
    assert_eq!(listed[0]["event_id"], event.as_str());

    // The inline attempt's record lands after the response, within the group commit's linger.
    let mut shown: Value = Value::Null;
    for _ in 0..100 {
        shown = serde_json::from_str(&db.cli(&[
            "deliveries",
            "show",
            "--tenant",
            &tenant.id,
            &delivery,
            "--json",
        ]))
        .unwrap();
        if shown["attempts"][0]["attempted_at"].is_string() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let attempted_at = shown["attempts"][0]["attempted_at"].as_str().unwrap();
    let next_attempt_at = shown["next_attempt_at"].as_str().unwrap();
    assert!(next_attempt_at > attempted_at, "{shown}");
    let text = db.cli(&["deliveries", "show", "--tenant", &tenant.id, &delivery]);
    assert!(
        text.contains(attempted_at) && text.contains(next_attempt_at),
        "{text}"
    );
    assert!(text.contains("inline") && text.contains("503"), "{text}");
    let table = db.cli(&["deliveries", "list", "--tenant", &tenant.id]);
    assert!(
        table.contains(&delivery) && table.contains("pending"),
        "{table}"
    );
}

async fn allow_private_destinations_is_a_bare_flag(backend: Backend) {
    let db = TestDb::new(backend).await;
    let refused = db.cli_output(
        &[
            "tenant",
            "create",
            "--name",
            "t",
            "--callback-url",
            "http://127.0.0.1:9/hook",
        ],
        &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "0")],
    );
    assert!(
        !refused.status.success(),
        "a private destination, not allowed"
    );
    let allowed = db.cli_output(
        &[
            "tenant",
            "create",
            "--name",
            "t",
            "--callback-url",
            "http://127.0.0.1:9/hook",
            "--allow-private-destinations",
            "--json",
        ],
        &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "0")],
    );
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
}

on_both_backends!(
    tenants_are_listed_and_shown_and_tenant_defaults_to_the_exported_id,
    a_send_retried_by_hand_under_its_key_gets_the_first_answer,
    deliveries_show_when_each_attempt_was_made_and_when_the_next_is_due,
    allow_private_destinations_is_a_bare_flag,
);
