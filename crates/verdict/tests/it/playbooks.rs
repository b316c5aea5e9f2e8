//! Playbooks through the CLI and the API, and the events API that reads decisions back.

use crate::common::{Backend, Reply, Server, TestDb, new_key, sim_swap};

const DENY_V: &str = r#"
[[rule]]
name = "deny_swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["deny"]
"#;

const STEP_UP_V: &str = r#"
[[rule]]
name = "step_up_swaps"
when = { type = ["sim_swap"] }
decision = "step_up"
actions = []
"#;

async fn each_decision_names_the_playbook_version_that_made_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);

    let built_in = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900301"))
        .await;
    assert_eq!(built_in.json()["playbook_version"], 0);

    assert!(db.set_playbook(&tenant, DENY_V).contains("version 1"));
    let first = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900302"))
        .await;
    assert_eq!(first.json()["playbook_version"], 1);
    assert_eq!(first.json()["decision"], "deny");
    assert_eq!(first.json()["rule"], "deny_swaps");

    let put = Reply::from(
        server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(STEP_UP_V)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(put.status, 201);
    assert_eq!(put.json()["version"], 2);
    let second = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900303"))
        .await;
    assert_eq!(second.json()["playbook_version"], 2);
    assert_eq!(second.json()["decision"], "step_up");

    // The stored events keep the version that decided them.
    let event = server
        .event(&tenant, first.json()["event_id"].as_str().unwrap())
        .await;
    assert_eq!(event["playbook_version"], 1);
    let shown = server.get(&tenant, "/v1/playbook").await;
    assert_eq!(shown.json()["version"], 2);
    assert!(
        shown.json()["source"]
            .as_str()
            .unwrap()
            .contains("step_up_swaps")
    );
}

async fn invalid_playbook_is_refused_naming_the_problem_and_the_old_one_stays(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    db.set_playbook(&tenant, DENY_V);

    let bad = "[[rule]]\nname = \"oops\"\ndecision = \"deny\"\nactions = [\"lock_acount\"]\n";
    let path = db.dir().join("bad.toml");
    std::fs::write(&path, bad).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args([
            "playbook",
            "set",
            "--tenant",
            &tenant.id,
            path.to_str().unwrap(),
        ])
        .env("VERDICT_DATABASE_URL", &db.url)
        .env("VERDICT_MASTER_KEY", &db.master_key)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lock_acount") && err.contains("line 4"),
        "{err}"
    );

    let server = Server::start(&db, &[]);
    let put = Reply::from(
        server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/json")
            .body(r#"{"rule":[{"name":"x","decision":"perhaps"}]}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(put.status, 400);
    assert_eq!(
        put.json()["type"],
        "https://verdict.dev/problems/invalid-playbook"
    );
    assert!(put.json()["detail"].as_str().unwrap().contains("perhaps"));

    let decided = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900304"))
        .await;
    assert_eq!(
        decided.json()["playbook_version"],
        1,
        "the old playbook stays in force"
    );
    assert_eq!(decided.json()["rule"], "deny_swaps");
}

async fn events_are_listed_newest_first_in_pages_and_scoped_to_the_tenant(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let mut ids = Vec::new();
    for i in 0..5 {
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap(&format!("+44770090040{i}")),
            )
            .await;
        ids.push(reply.json()["event_id"].as_str().unwrap().to_owned());
    }
    let page1 = server.get(&tenant, "/v1/events?limit=3").await.json();
    let got: Vec<&str> = page1["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![&ids[4], &ids[3], &ids[2]]);
    let cursor = page1["next_cursor"].as_str().unwrap();
    let page2 = server
        .get(&tenant, &format!("/v1/events?limit=3&before={cursor}"))
        .await
        .json();
    let got: Vec<&str> = page2["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, vec![&ids[1], &ids[0]]);
    assert!(page2["next_cursor"].is_null());

    let event = server.event(&tenant, &ids[0]).await;
    assert_eq!(event["type"], "sim_swap");
    assert_eq!(event["metadata"]["case_ref"], "abc-1");
    assert!(event["deliveries"].is_array());
    assert!(
        !event.to_string().contains("+4477009004"),
        "no raw identifier in the API"
    );

    assert_eq!(
        server
            .get(&other, &format!("/v1/events/{}", ids[0]))
            .await
            .status,
        404
    );
    assert!(
        server.get(&other, "/v1/events").await.json()["data"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let hash = event["subject_hash"].as_str().unwrap();
    let theirs = server
        .get(&other, &format!("/v1/subjects/{hash}"))
        .await
        .json();
    assert!(
        theirs["lock"].is_null(),
        "another tenant sees nothing of this subject"
    );
    assert_eq!(
        server.get(&tenant, "/v1/events/not-a-uuid").await.status,
        404
    );
    let anonymous = Reply::from(
        server
            .client
            .get(format!("{}/v1/events", server.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(anonymous.status, 401);
}

async fn metrics_count_signals_conflicts_decisions_and_latency(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900310");
    assert_eq!(server.send(&tenant, Some(&key), &body).await.status, 200);
    assert!(server.send(&tenant, Some(&key), &body).await.replayed());
    assert_eq!(
        server
            .send(&tenant, Some(&key), &sim_swap("+447700900311"))
            .await
            .status,
        422
    );
    let text = server.metrics().await;
    for expected in [
        "verdict_signals_total 3",
        "verdict_replays_total 1",
        "verdict_key_mismatches_total 1",
        "verdict_decisions_total{decision=\"deny\"} 1",
        "verdict_http_request_duration_seconds_bucket{route=\"/v1/signals\",status=\"2xx\"",
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
}

on_both_backends!(
    metrics_count_signals_conflicts_decisions_and_latency,
    each_decision_names_the_playbook_version_that_made_it,
    invalid_playbook_is_refused_naming_the_problem_and_the_old_one_stays,
    events_are_listed_newest_first_in_pages_and_scoped_to_the_tenant,
);
