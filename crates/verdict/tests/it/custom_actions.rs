//! Custom actions: a rule may name an action of the tenant's own (`notify_siem`) once the
//! playbook binds it to an HTTP connector. It has no local effect; its call is made once per
//! signal, however often and under however many keys the signal comes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::effects::EffectReceiver;
use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key};

const ENV: [(&str, &str); 1] = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")];

const SIEM_PLAYBOOK: &str = r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["notify_siem", "deny", "callback"]

[actions.notify_siem]
connector = "siem"
"#;

/// A SIM swap of `phone`, observed at a fixed time so that its resends are the same signal.
fn swap(phone: &str) -> String {
    json!({
        "type": "sim_swap",
        "subject": {"phone": phone},
        "observed_at": "2026-12-01T10:00:00Z",
        "attributes": {},
        "metadata": {"ticket": "T-9"},
    })
    .to_string()
}

fn outcome<'a>(reply: &'a Value, action: &str) -> &'a Value {
    reply["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == action)
        .unwrap_or_else(|| panic!("no {action} in {reply}"))
}

/// Sets an HTTP connector `siem` to `url` and the playbook that binds `notify_siem` to it.
fn bind_siem(db: &TestDb, tenant: &Tenant, url: &str) {
    db.set_http_connector(tenant, "siem", url);
    db.set_playbook(tenant, SIEM_PLAYBOOK);
}

async fn put_playbook(server: &Server, tenant: &Tenant, source: &str) -> Reply {
    Reply::from(
        server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(source.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn a_custom_action_calls_its_connector_once_per_signal(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let siem = EffectReceiver::start(Duration::ZERO).await;
    bind_siem(&db, &tenant, &siem.url);
    let server = Server::start(&db, &ENV);

    let body = swap("+447700900611");
    let key = new_key();
    let first = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let decided = first.json();
    let notify = outcome(&decided, "notify_siem");
    assert_eq!(notify["outcome"], "done", "{decided}");
    assert_eq!(notify["connector"], "siem");
    let event_id = decided["event_id"].as_str().unwrap().to_owned();

    let calls = siem.calls();
    assert_eq!(calls.len(), 1, "one call");
    let request = calls[0].json();
    assert_eq!(request["action"], "notify_siem");
    assert_eq!(request["event_id"], event_id.as_str());
    assert_eq!(request["subject"]["phone"], "+447700900611");
    assert_eq!(request["metadata"]["ticket"], "T-9");
    assert_eq!(
        calls[0].header("idempotency-key"),
        format!("{event_id}:notify_siem")
    );

    // The same key again: the stored response, nothing called.
    let replay = server.send(&tenant, Some(&key), &body).await;
    assert!(replay.replayed());
    assert_eq!(replay.json(), decided);

    // The same signal without a key, three times, and under a new key: one signal, so its
    // custom action was already called.
    for key in [None, None, None, Some(new_key())] {
        let again = server.send(&tenant, key.as_deref(), &body).await.json();
        assert_eq!(
            outcome(&again, "notify_siem")["outcome"],
            "already_done",
            "{again}"
        );
    }
    assert_eq!(siem.calls().len(), 1, "called once for one signal");

    // Another signal about the same subject is another call.
    let later = body.replace("10:00:00Z", "11:00:00Z");
    let other = server.send(&tenant, None, &later).await.json();
    assert_eq!(outcome(&other, "notify_siem")["outcome"], "done", "{other}");
    assert_eq!(siem.applied().len(), 2, "one effect per signal");

    // The event shows the action and its request's delivery.
    let event = server.event(&tenant, &event_id).await;
    assert_eq!(outcome(&event, "notify_siem")["outcome"], "done");
    let requests: Vec<&Value> = event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["action"] == "notify_siem")
        .collect();
    assert_eq!(requests.len(), 1, "{event}");
    assert_eq!(requests[0]["status"], "succeeded");

    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    assert!(!dump.contains("447700900611"), "the phone number is stored");
}

async fn a_custom_action_is_refused_unbound_or_bound_to_what_is_not_there(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &ENV);

    let unbound = "[[rule]]\nname = \"r\"\ndecision = \"deny\"\n\nactions = [\"notify_siem\"]\n";
    let refused = put_playbook(&server, &tenant, unbound).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("line 5") && detail.contains("notify_siem") && detail.contains("bound"),
        "{detail}"
    );

    // Bound to a connector the tenant does not have.
    let refused = put_playbook(&server, &tenant, SIEM_PLAYBOOK).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("line 9") && detail.contains("siem"),
        "{detail}"
    );

    // Not a name a custom action may have.
    let bad = SIEM_PLAYBOOK.replace("notify_siem", "Notify-SIEM");
    let refused = put_playbook(&server, &tenant, &bad).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("Notify-SIEM"), "{}", refused.text());

    // Nothing was published: the built-in default is still in force.
    let shown = server.get(&tenant, "/v1/playbook").await.json();
    assert_eq!(shown["version"], 0, "{shown}");
}

async fn a_rule_may_ask_for_at_most_sixteen_actions(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    db.set_http_connector(&tenant, "siem", "http://127.0.0.1:9/actions");
    let server = Server::start(&db, &ENV);
    let playbook = |n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("custom_{i}")).collect();
        let mut source =
            format!("[[rule]]\nname = \"many\"\ndecision = \"deny\"\nactions = {names:?}\n",);
        for name in &names {
            source.push_str(&format!("\n[actions.{name}]\nconnector = \"siem\"\n"));
        }
        source
    };
    let at_most = put_playbook(&server, &tenant, &playbook(16)).await;
    assert_eq!(at_most.status, 201, "{}", at_most.text());
    let over = put_playbook(&server, &tenant, &playbook(17)).await;
    assert_eq!(over.status, 422, "{}", over.text());
    assert!(over.text().contains("at most 16"), "{}", over.text());

    // Bindings: at most 32, even when no rule names them.
    let mut bindings = playbook(1);
    for i in 0..32 {
        bindings.push_str(&format!("\n[actions.spare_{i}]\nconnector = \"siem\"\n"));
    }
    let over = put_playbook(&server, &tenant, &bindings).await;
    assert_eq!(over.status, 422, "{}", over.text());
    assert!(over.text().contains("at most 32"), "{}", over.text());
}

async fn the_largest_signal_makes_a_bounded_request_that_arrives_whole(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let siem = EffectReceiver::start(Duration::ZERO).await;
    bind_siem(&db, &tenant, &siem.url);
    let server = Server::start(&db, &ENV);

    // Metadata that fills the signal up to its 64 KiB limit.
    let small = swap("+447700900612");
    let blob = "é".repeat((64 * 1024 - small.len() - 40) / 2);
    let mut body: Value = serde_json::from_str(&small).unwrap();
    body["metadata"]["blob"] = Value::from(blob.clone());
    let body = body.to_string();
    assert!(
        body.len() <= 64 * 1024 && body.len() > 63 * 1024,
        "{}",
        body.len()
    );
    let reply = server.send(&tenant, Some(&new_key()), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(outcome(&reply.json(), "notify_siem")["outcome"], "done");

    let calls = siem.calls();
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].body.len() <= verdict::connectors::request::MAX_REQUEST_BYTES,
        "a request of {} bytes",
        calls[0].body.len()
    );
    assert_eq!(calls[0].json()["metadata"]["blob"], blob.as_str());
}

on_both_backends!(
    the_largest_signal_makes_a_bounded_request_that_arrives_whole,
    a_custom_action_calls_its_connector_once_per_signal,
    a_custom_action_is_refused_unbound_or_bound_to_what_is_not_there,
    a_rule_may_ask_for_at_most_sixteen_actions,
);
