//! The operator console in a real browser: Debian's headless Chromium, driven by
//! `playwright-core` (tests/console/browser.mjs), against the real server seeded with a history
//! that has a dead letter and a decision made on a locked subject, and a second tenant whose
//! `lock_account` is bound to a real SCIM server (`scim2-server`) that a SIM swap has locked a
//! user in. Screenshots of the main pages go to `target/console-screenshots/<backend>/` and are
//! checked to be non-blank.

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::effects::ScimServer;
use crate::common::receiver::{Receiver, Step};
use crate::common::{
    Backend, MANUAL_WORKER, Reply, Server, Tenant, TestDb, new_key, sim_swap, sim_swap_of_account,
};

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

/// The subjects tenant's playbook: a SIM swap locks the account through the SCIM connector
/// `idp`, unless it is locked already.
const SCIM_LOCK_PLAYBOOK: &str = r#"[[rule]]
name = "subject_already_locked"
when = { subject_locked = true }
decision = "deny"
actions = ["deny"]

[[rule]]
name = "recent_sim_swap"
when = { type = ["sim_swap"], observed_within_hours = 72 }
decision = "deny"
actions = ["lock_account", "open_case", "deny"]

[actions.lock_account]
connector = "idp"
"#;

/// The account the browser looks up and unlocks: the SCIM user's `userName`.
const ACCOUNT: &str = "grace-7d41c0";

/// An action's entry in a decision.
fn outcome<'a>(decided: &'a Value, action: &str) -> &'a Value {
    decided["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {decided}"))
}

/// The subject's state as `POST /v1/subjects/lookup` has it.
async fn looked_up(server: &Server, tenant: &Tenant, account: &str) -> Value {
    let reply = Reply::from(
        server
            .client
            .post(format!("{}/v1/subjects/lookup", server.base))
            .bearer_auth(&tenant.api_key)
            .json(&json!({ "account": account }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

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

async fn an_operator_signs_in_redelivers_a_dead_letter_publishes_a_change_and_unlocks_a_subject(
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
    let event = server.event(&tenant, &dead_event).await;
    assert_eq!(event["deliveries"][0]["status"], "dead", "{event}");

    // A second tenant, whose SIM swap about ACCOUNT deactivates the SCIM user.
    let scim = ScimServer::start().await;
    let idp_tenant = db.tenant(&[]);
    scim.register(&db, &idp_tenant, "idp");
    db.set_playbook(&idp_tenant, SCIM_LOCK_PLAYBOOK);
    let user = scim.create_user(ACCOUNT, "acct-grace", true).await;
    let swap = server
        .send(
            &idp_tenant,
            Some(&new_key()),
            &sim_swap_of_account(ACCOUNT, 90),
        )
        .await;
    assert_eq!(swap.status, 200, "{}", swap.text());
    let swap = swap.json();
    assert_eq!(outcome(&swap, "lock_account")["outcome"], "done", "{swap}");
    assert_eq!(outcome(&swap, "lock_account")["connector"], "idp");
    assert_eq!(scim.user(&user).await["active"], false, "locked in the IdP");

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
        .env("SUBJECTS_API_KEY", &idp_tenant.api_key)
        .env("SUBJECT_ACCOUNT", ACCOUNT)
        .env("LOCK_EVENT", swap["event_id"].as_str().unwrap())
        .output()
        .expect("node runs the browser test");
    let report = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the browser test failed:\n{report}");

    // What the browser did is what the server stored.
    let event = server.event(&tenant, &dead_event).await;
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

    // The browser's unlock reached the identity provider, and the lock is gone here.
    assert_eq!(
        scim.user(&user).await["active"],
        true,
        "the unlock made the SCIM user active again"
    );
    let state = looked_up(&server, &idp_tenant, ACCOUNT).await;
    assert!(state["lock"].is_null(), "{state}");
    // The next SIM swap is decided afresh: it locks the account, here and there, again.
    let next = server
        .send(
            &idp_tenant,
            Some(&new_key()),
            &sim_swap_of_account(ACCOUNT, 30),
        )
        .await
        .json();
    assert_eq!(next["rule"], "recent_sim_swap", "{next}");
    assert_eq!(outcome(&next, "lock_account")["outcome"], "done", "{next}");
    assert_eq!(scim.user(&user).await["active"], false, "locked again");

    let logs = server.logs();
    assert!(
        !logs.contains(&tenant.api_key) && !logs.contains(&idp_tenant.api_key),
        "an API key reached the logs"
    );
    assert!(!logs.contains(ACCOUNT), "the account reached the logs");
}

on_both_backends!(
    an_operator_signs_in_redelivers_a_dead_letter_publishes_a_change_and_unlocks_a_subject
);
