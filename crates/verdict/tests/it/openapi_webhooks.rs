//! The OpenAPI document's `webhooks`: what verdict really sends, a callback and a connector's
//! action request, validates against the schema and headers the document gives for it, checked
//! by an independent JSON Schema validator (Python `jsonschema`, 2020-12 as OpenAPI 3.1 uses).

use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, Server, TestDb, new_key};

/// Validates `instance` against the document's component `schema` (its `$ref`s resolved in the
/// document itself); the validator's message if it does not hold.
fn validate(document: &Value, schema: &str, instance: &Value) -> Result<(), String> {
    let input = json!({"document": document, "schema": schema, "instance": instance});
    let script = "import json, sys\n\
        from jsonschema import Draft202012Validator\n\
        i = json.load(sys.stdin)\n\
        root = {'$ref': '#/components/schemas/' + i['schema'], 'components': i['document']['components']}\n\
        Draft202012Validator(root).validate(i['instance'])";
    let mut check = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with jsonschema (openapi-spec-validator brings it)");
    check
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The webhook's body schema and the headers it declares required.
fn webhook<'a>(document: &'a Value, name: &str) -> (&'a str, Vec<&'a str>) {
    let post = &document["webhooks"][name]["post"];
    let schema = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap_or_else(|| panic!("webhook {name} has no body schema: {post}"));
    let headers = post["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in"] == "header" && p["required"] == true)
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    (schema.trim_start_matches("#/components/schemas/"), headers)
}

async fn a_real_callback_and_action_request_match_the_documents_webhooks(backend: Backend) {
    let db = TestDb::new(backend).await;
    let callbacks = Receiver::start(Vec::new()).await;
    let cases = Receiver::start(vec![Step::status(204)]).await;
    let tenant = db.tenant(&["--no-inbound-signature", "--callback-url", &callbacks.url]);
    db.set_http_connector(&tenant, "cases", &cases.url);
    db.set_playbook(
        &tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["open_case", "deny", "callback"]

[actions.open_case]
connector = "cases"
"#,
    );
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let observed = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    let signal = json!({
        "type": "sim_swap",
        "subject": {"account": "alice"},
        "observed_at": observed.format(&time::format_description::well_known::Rfc3339).unwrap(),
        "metadata": {"case_ref": "r-1"},
    });
    let reply = server
        .send(&tenant, Some(&new_key()), &signal.to_string())
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let document = server.openapi().await.json();
    assert!(document["openapi"].as_str().unwrap().starts_with("3.1"));
    for (name, receiver) in [("decision", &callbacks), ("action_request", &cases)] {
        let (schema, headers) = webhook(&document, name);
        let sent = wait_for_one(receiver).await;
        for header in headers {
            assert!(
                !sent.header(header).is_empty(),
                "{name} lacks the required header {header}"
            );
        }
        let body = sent.json();
        if let Err(why) = validate(&document, schema, &body) {
            panic!("a real {name} does not match the document: {why}");
        }
        // The schema has teeth: an action result without its outcome is refused.
        if name == "decision" {
            let mut broken = body.clone();
            broken["actions"][0]
                .as_object_mut()
                .unwrap()
                .remove("outcome");
            assert!(validate(&document, schema, &broken).is_err());
        }
    }
}

/// The receiver's first request, within 10 s.
async fn wait_for_one(receiver: &Receiver) -> crate::common::receiver::Received {
    for _ in 0..100 {
        if let Some(first) = receiver.received().into_iter().next() {
            return first;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing arrived at {}", receiver.url);
}

on_both_backends!(a_real_callback_and_action_request_match_the_documents_webhooks);
