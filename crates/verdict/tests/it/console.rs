//! The operator console in a real browser: Debian's headless Chromium, driven by
//! `playwright-core` (tests/console/browser.mjs), against the real server seeded with a history
//! that has a dead letter and a decision made on a locked subject. Screenshots of the main
//! pages go to `target/console-screenshots/<backend>/` and are checked to be non-blank.

use std::process::Command;
use std::time::Duration;

use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Server, TestDb, new_key, sim_swap};

/// The default playbook without `subject_already_locked`: the simulation must show exactly the
/// one event decided by that rule changing.
const WITHOUT_LOCKED_RULE: &str = r#"[[rule]]
name = "recent_sim_swap"
when = { type = ["sim_swap"], observed_within_hours = 72 }
decision = "deny"
actions = ["lock_account", "open_case", "alert_customer", "deny", "callback"]

[[rule]]
name = "default_allow"
decision = "allow"
actions = ["callback"]
"#;

fn console_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console")
}

/// Fails, never skips, when the browser or the driver is missing: `scripts/test` installs both.
fn require_tools() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "Chromium is missing: `apt-get install chromium` (scripts/test does it)"
    );
    assert!(
        console_dir().join("node_modules/playwright-core").exists(),
        "playwright-core is missing: `npm ci --prefix crates/verdict/tests/console` (scripts/test does it)"
    );
}

async fn an_operator_signs_in_redelivers_a_dead_letter_and_publishes_a_simulated_change(
    backend: Backend,
) {
    require_tools();
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![Step::status(500); 4]).await;
    receiver.answer_by_default(Step::status(204));
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let retry = [("VERDICT_RETRY_INTERVAL_SECS", "1")];

    // History: a swap that locks its subject (its callback will die), then a second swap on the
    // now-locked subject.
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+15550001111"))
        .await;
    assert_eq!(first.status, 200);
    let dead_event = first.json()["event_id"].as_str().unwrap().to_owned();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        db.worker_once(&retry);
    }
    let second = server
        .send(&tenant, Some(&new_key()), &sim_swap("+15550001111"))
        .await;
    assert_eq!(second.json()["rule"], "subject_already_locked");
    let event = server
        .get(&tenant, &format!("/v1/events/{dead_event}"))
        .await
        .json();
    assert_eq!(event["deliveries"][0]["status"], "dead", "{event}");

    let shots = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/console-screenshots")
        .join(match backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        });
    let playbook = db.dir().join("without-locked-rule.toml");
    std::fs::write(&playbook, WITHOUT_LOCKED_RULE).unwrap();
    let out = Command::new("node")
        .arg(console_dir().join("browser.mjs"))
        .env("BASE", &server.base)
        .env("API_KEY", &tenant.api_key)
        .env("DEAD_EVENT", &dead_event)
        .env("SHOTS", &shots)
        .env("GOOD_PLAYBOOK", &playbook)
        .output()
        .expect("node runs the browser test");
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the browser test failed:\n{report}");

    // What the browser did is what the server stored.
    let event = server
        .get(&tenant, &format!("/v1/events/{dead_event}"))
        .await
        .json();
    let delivery_id = event["deliveries"][0]["id"].as_str().unwrap();
    let delivery = server
        .get(&tenant, &format!("/v1/deliveries/{delivery_id}"))
        .await
        .json();
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        5,
        "4 failed attempts and the redelivery: {delivery}"
    );
    assert_eq!(attempts[4]["trigger"], "redeliver");
    let playbook = server.get(&tenant, "/v1/playbook").await.json();
    assert_eq!(playbook["version"], 1);
    assert!(
        !server.logs().contains(&tenant.api_key),
        "the API key reached the logs"
    );
}

on_both_backends!(an_operator_signs_in_redelivers_a_dead_letter_and_publishes_a_simulated_change);
