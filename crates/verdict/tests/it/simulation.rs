//! Playbook simulation: a candidate run against stored events gives, for each, what the playbook
//! in force gave and what the candidate would give, exactly (each event keeps the facts and the
//! time its decision evaluated), and writes nothing.

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, sim_swap};
use serde_json::Value;

/// The default playbook without its first rule, `subject_already_locked`.
const WITHOUT_LOCKED_RULE: &str = r#"
[[rule]]
name = "recent_sim_swap"
when = { type = ["sim_swap"], observed_within_hours = 72 }
decision = "deny"
actions = ["lock_account", "open_case", "alert_customer", "deny", "callback"]

[[rule]]
name = "recent_port_out"
when = { type = ["port_out"], observed_within_hours = 72 }
decision = "deny"
actions = ["lock_account", "open_case", "alert_customer", "deny", "callback"]

[[rule]]
name = "breached_credential"
when = { type = ["credential_breach"] }
decision = "step_up"
actions = ["alert_customer", "charge_step_up", "callback"]

[[rule]]
name = "default_allow"
decision = "allow"
actions = ["callback"]
"#;

fn sim_swap_hours_ago(phone: &str, hours: i64) -> String {
    let at = time::OffsetDateTime::now_utc() - time::Duration::hours(hours);
    let at = at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    format!(r#"{{"type":"sim_swap","subject":{{"phone":"{phone}"}},"observed_at":"{at}"}}"#)
}

async fn simulate(server: &Server, tenant: &Tenant, query: &str, playbook: &str) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}/v1/playbook/simulate{query}", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(playbook.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Sends the history: a recent swap (locks the subject), a second one on the locked subject, an
/// old swap, and a breached credential.
async fn history(server: &Server, tenant: &Tenant) -> Vec<String> {
    let bodies = [
        sim_swap("+15550000001"),
        sim_swap("+15550000001"),
        sim_swap_hours_ago("+15550000002", 100),
        r#"{"type":"credential_breach","subject":{"account":"acct-1"},"observed_at":"2026-01-01T00:00:00Z"}"#.to_owned(),
    ];
    let mut rules = Vec::new();
    for body in bodies {
        let reply = server.send(tenant, Some(&new_key()), &body).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        rules.push(reply.json()["rule"].as_str().unwrap().to_owned());
    }
    rules
}

async fn the_playbook_in_force_reproduces_every_stored_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let rules = history(&server, &tenant).await;
    assert_eq!(
        rules,
        [
            "recent_sim_swap",
            "subject_already_locked",
            "default_allow",
            "breached_credential"
        ]
    );
    let default = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/playbooks/default.toml"
    ))
    .unwrap();
    let reply = simulate(&server, &tenant, "", &default).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        server
            .logs()
            .lines()
            .filter(|l| l.contains("ERROR"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let result = reply.json();
    assert_eq!(result["examined"], 4);
    assert_eq!(result["changed"], 0, "{result:#}");
    assert_eq!(result["inexact"], 0);
}

async fn a_candidate_without_the_locked_rule_changes_only_the_locked_subjects_event(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    history(&server, &tenant).await;
    let before = (
        db.count("events").await,
        db.count("idempotency_keys").await,
        db.count("playbooks").await,
        db.count("account_locks").await,
        db.count("deliveries").await,
    );
    let (_, reader) = db.issue_key(&tenant, "read");
    let reply = simulate(&server, &reader, "?limit=10", WITHOUT_LOCKED_RULE).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let result = reply.json();
    assert_eq!(
        (result["examined"].as_u64(), result["changed"].as_u64()),
        (Some(4), Some(1))
    );
    let changes = result["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0]["from_rule"], "subject_already_locked");
    assert_eq!(changes[0]["to_rule"], "recent_sim_swap");
    assert_eq!(changes[0]["events"], 1);
    let changed: Vec<&Value> = result["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["changed"] == true)
        .collect();
    assert_eq!(
        changed[0]["actual"]["actions"],
        serde_json::json!(["deny", "open_case", "callback"])
    );
    assert_eq!(changed[0]["candidate"]["decision"], "deny");
    let after = (
        db.count("events").await,
        db.count("idempotency_keys").await,
        db.count("playbooks").await,
        db.count("account_locks").await,
        db.count("deliveries").await,
    );
    assert_eq!(before, after, "a simulation wrote something");

    // The window: the newest event only.
    let newest = simulate(&server, &tenant, "?limit=1", WITHOUT_LOCKED_RULE).await;
    assert_eq!(newest.json()["examined"], 1);
    let future = simulate(
        &server,
        &tenant,
        "?since=2999-01-01T00:00:00Z",
        WITHOUT_LOCKED_RULE,
    )
    .await;
    assert_eq!(future.json()["examined"], 0);

    // The CLI prints the same summary as a table.
    let table = db.cli(&[
        "playbook",
        "simulate",
        "--tenant",
        &tenant.id,
        &write_temp(&db, WITHOUT_LOCKED_RULE),
    ]);
    assert!(
        table.starts_with("4 events examined, 1 would change"),
        "{table}"
    );
    assert!(
        table.contains("subject_already_locked (deny)") && table.contains("recent_sim_swap (deny)"),
        "{table}"
    );
}

fn write_temp(db: &TestDb, source: &str) -> String {
    let path = db
        .dir()
        .join(format!("candidate-{}.toml", uuid::Uuid::new_v4()));
    std::fs::write(&path, source).unwrap();
    path.display().to_string()
}

async fn bad_candidates_and_windows_are_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    for (query, playbook, status, problem) in [
        (
            "",
            "[[rule]]\nname = \"a\"\ndecision = \"maybe\"\n",
            400,
            "invalid-playbook",
        ),
        ("?limit=0", WITHOUT_LOCKED_RULE, 400, "invalid-request"),
        ("?limit=10001", WITHOUT_LOCKED_RULE, 400, "invalid-request"),
        (
            "?since=yesterday",
            WITHOUT_LOCKED_RULE,
            400,
            "invalid-request",
        ),
        ("?colour=red", WITHOUT_LOCKED_RULE, 400, "invalid-request"),
    ] {
        let reply = simulate(&server, &tenant, query, playbook).await;
        assert_eq!(
            reply.status,
            status,
            "{query}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(
            reply.json()["type"],
            format!("https://verdict.dev/problems/{problem}")
        );
    }
    let (_, ingester) = db.issue_key(&tenant, "ingest");
    let reply = simulate(&server, &ingester, "", WITHOUT_LOCKED_RULE).await;
    assert_eq!(reply.status, 403);
}

async fn a_tenant_runs_one_simulation_at_a_time_and_signals_go_on_beside_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    // The first simulation to read a page is held there for 1.5 s.
    let server = Server::start(
        &db,
        &[("FAILPOINTS", "simulation::page=1*return(delay_ms=1500)")],
    );
    let candidate = "[[rule]]\nname = \"all\"\ndecision = \"deny\"\n";
    let started = std::time::Instant::now();
    let (first, second, elsewhere, signal) = tokio::join!(
        simulate(&server, &tenant, "?limit=10000", candidate),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            simulate(&server, &tenant, "?limit=10000", candidate).await
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let reply = simulate(&server, &other, "?limit=10000", candidate).await;
            (reply, started.elapsed())
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let at = std::time::Instant::now();
            let reply = server
                .send(&other, Some(&new_key()), &sim_swap("+447700900990"))
                .await;
            (reply, at.elapsed())
        },
    );
    assert_eq!(first.status, 200, "{}", first.text());
    // The same tenant's second one, while the first runs: refused, to retry.
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(
        second.json()["type"],
        "https://verdict.dev/problems/simulation-in-progress"
    );
    assert!(second.header("retry-after").is_some());
    // Another tenant's waits its turn, then runs.
    let (elsewhere, finished_at) = elsewhere;
    assert_eq!(elsewhere.status, 200, "{}", elsewhere.text());
    assert!(
        finished_at >= std::time::Duration::from_millis(1400),
        "another tenant's simulation ran beside the first, done after {finished_at:?}"
    );
    // A signal is not held up by either.
    let (signal, took) = signal;
    assert_eq!(signal.status, 200, "{}", signal.text());
    assert!(
        took < std::time::Duration::from_secs(1),
        "a signal took {took:?}"
    );
    // Once done, the tenant simulates again.
    assert_eq!(simulate(&server, &tenant, "", candidate).await.status, 200);
}

on_both_backends!(
    a_tenant_runs_one_simulation_at_a_time_and_signals_go_on_beside_it,
    the_playbook_in_force_reproduces_every_stored_decision,
    a_candidate_without_the_locked_rule_changes_only_the_locked_subjects_event,
    bad_candidates_and_windows_are_refused,
);
