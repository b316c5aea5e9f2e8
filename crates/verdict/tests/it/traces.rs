//! OpenTelemetry traces, end to end: the real binary exports over OTLP/HTTP to a collector that
//! decodes with the official `opentelemetry-proto` package, and the span tree, the caller's
//! trace context and the `traceparent` the tenant's systems receive are checked against each
//! other. A worker's retry is a trace of its own. With the variable unset, nothing is exported
//! and nothing propagated.

use serde_json::Value;

use crate::common::collector::Collector;
use crate::common::deliveries::wait_for_next_round;
use crate::common::effects::EffectReceiver;
use crate::common::receiver::{Receiver, Step};
use crate::common::{
    Backend, MANUAL_WORKER, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap,
};

/// The caller's trace and span, as its `traceparent` names them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const PHONE: &str = "+15550104242";

/// A tenant whose `deny` opens a case through an HTTP connector `cases` and calls back.
fn traced_tenant(db: &TestDb, callback: &str, cases: &str) -> Tenant {
    let tenant = db.tenant(&["--callback-url", callback]);
    db.set_http_connector(&tenant, "cases", cases);
    db.set_playbook(
        &tenant,
        r#"
[[rule]]
name = "swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["open_case", "callback"]

[actions.open_case]
connector = "cases"
"#,
    );
    tenant
}

/// Sends a SIM swap about `phone` under `key`, with `traceparent` if given.
async fn send_traced(
    server: &Server,
    tenant: &Tenant,
    key: &str,
    phone: &str,
    traceparent: Option<&str>,
) -> Reply {
    let body = sim_swap(phone);
    let mut req = signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        tenant,
        Some(key),
        &body,
        now(),
    );
    if let Some(traceparent) = traceparent {
        req = req.header("traceparent", traceparent);
    }
    Reply::from(req.send().await.unwrap()).await
}

/// The span named `name` whose `attr` is `value`.
fn span<'a>(spans: &'a [Value], name: &str, attr: &str, value: &str) -> &'a Value {
    spans
        .iter()
        .find(|s| s["name"] == name && s["attributes"][attr] == value)
        .unwrap_or_else(|| panic!("no {name} span with {attr}={value} in {spans:#?}"))
}

/// Whether `ancestor` is `span`'s parent, or its parent's, and so on, within one trace.
fn descends_from(spans: &[Value], span: &Value, ancestor: &Value) -> bool {
    let mut at = span;
    for _ in 0..spans.len() {
        if at["trace_id"] != ancestor["trace_id"] {
            return false;
        }
        if at["parent_span_id"] == ancestor["span_id"] {
            return true;
        }
        match spans.iter().find(|s| s["span_id"] == at["parent_span_id"]) {
            Some(parent) => at = parent,
            None => return false,
        }
    }
    false
}

/// A `traceparent` as received: (trace id, parent span id).
fn named_by(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent:?}");
    assert_eq!(parts[0], "00", "{traceparent:?}");
    (parts[1].to_owned(), parts[2].to_owned())
}

async fn a_signal_is_one_trace_from_the_caller_to_the_tenants_systems(backend: Backend) {
    let db = TestDb::new(backend).await;
    let collector = Collector::start(db.dir());
    let callback = Receiver::start(vec![]).await;
    let cases = EffectReceiver::start(std::time::Duration::ZERO).await;
    let tenant = traced_tenant(&db, &callback.url, &cases.url);
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "verdict-traces-test"),
        ],
    );

    let key = new_key();
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let reply = send_traced(&server, &tenant, &key, PHONE, Some(&traceparent)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    // A malformed traceparent and one over the size bound are ignored, never refused.
    let malformed = send_traced(
        &server,
        &tenant,
        &new_key(),
        "+15550104243",
        Some("00-zz-1"),
    )
    .await;
    assert_eq!(malformed.status, 200, "{}", malformed.text());
    let oversized = format!(
        "01-{TRACE_ID}-{CALLER_SPAN}-01-{}",
        "a".repeat(verdict::telemetry::MAX_TRACE_HEADER)
    );
    let long = send_traced(
        &server,
        &tenant,
        &new_key(),
        "+15550104244",
        Some(&oversized),
    )
    .await;
    assert_eq!(long.status, 200, "{}", long.text());
    let ids: Vec<String> = [&malformed, &long]
        .iter()
        .map(|r| r.json()["event_id"].as_str().unwrap().to_owned())
        .collect();

    // Graceful shutdown flushes the batch exporter: every span is at the collector once the
    // process has exited (the exporter's own schedule is 5 s, longer than this test waits).
    assert!(server.terminate(), "verdict serve did not stop cleanly");
    let requests = collector.requests();
    assert!(!requests.is_empty(), "nothing was exported");
    for request in &requests {
        assert_eq!(request["path"], "/v1/traces", "{request}");
        assert_eq!(
            request["content_type"], "application/x-protobuf",
            "{request}"
        );
        assert!(request.get("error").is_none(), "{request}");
    }
    let spans = collector.spans();
    assert!(
        spans.iter().all(|s| s["service"] == "verdict-traces-test"),
        "{spans:#?}"
    );

    // The request span continues the caller's trace, as the child of the caller's span.
    let root = spans
        .iter()
        .find(|s| s["name"] == "request" && s["trace_id"] == TRACE_ID)
        .unwrap_or_else(|| panic!("no request span in the caller's trace: {spans:#?}"));
    assert_eq!(root["parent_span_id"], CALLER_SPAN, "{root:#}");
    assert_eq!(root["attributes"]["route"], "/v1/signals");
    assert_eq!(root["attributes"]["method"], "POST");
    assert_eq!(root["attributes"]["http.response.status_code"], 200);

    // decide, commit, callback and connector_call are its descendants, in that one trace.
    let in_trace: Vec<Value> = spans
        .iter()
        .filter(|s| s["trace_id"] == TRACE_ID)
        .cloned()
        .collect();
    for name in ["decide", "commit", "callback", "connector_call"] {
        let found = in_trace
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no {name} span in the caller's trace: {in_trace:#?}"));
        assert!(
            descends_from(&in_trace, found, root),
            "{name} is not under the request span: {in_trace:#?}"
        );
    }
    let decide = in_trace.iter().find(|s| s["name"] == "decide").unwrap();
    assert_eq!(decide["attributes"]["decision"], "deny");
    let commit = span(&in_trace, "commit", "phase", "act");
    assert_eq!(commit["attributes"]["event_id"], event_id.as_str());
    assert!(
        commit["attributes"]["signals"]
            .as_i64()
            .is_some_and(|n| n >= 1),
        "{commit:#}"
    );

    // The callback, as received, names the callback span; so does the connector call its own.
    let sent = callback.received();
    assert_eq!(sent.len(), 3, "one callback per signal");
    let call = span(&in_trace, "callback", "event_id", &event_id);
    assert_eq!(call["kind"], "SPAN_KIND_CLIENT");
    assert_eq!(call["attributes"]["http.response.status_code"], 200);
    assert_eq!(call["attributes"]["outcome"], "delivered");
    let webhook_id = call["attributes"]["webhook_id"].as_str().unwrap();
    let sent = sent
        .iter()
        .find(|r| r.header("webhook-id") == webhook_id)
        .unwrap_or_else(|| panic!("no callback with webhook-id {webhook_id}"));
    assert_eq!(
        named_by(sent.header("traceparent")),
        (
            TRACE_ID.to_owned(),
            call["span_id"].as_str().unwrap().to_owned()
        )
    );
    let calls = cases.calls();
    assert_eq!(calls.len(), 3, "one case per signal");
    let case = calls
        .iter()
        .find(|c| c.header("idempotency-key") == format!("{event_id}:open_case"))
        .unwrap();
    let connector_call = span(&in_trace, "connector_call", "event_id", &event_id);
    assert_eq!(connector_call["kind"], "SPAN_KIND_CLIENT");
    assert_eq!(connector_call["attributes"]["connector"], "cases");
    assert_eq!(connector_call["attributes"]["action"], "open_case");
    assert_eq!(
        connector_call["attributes"]["http.response.status_code"],
        204
    );
    assert_eq!(
        named_by(case.header("traceparent")),
        (
            TRACE_ID.to_owned(),
            connector_call["span_id"].as_str().unwrap().to_owned()
        )
    );

    // The ignored traceparents: each request is the root of a trace of its own.
    for id in &ids {
        let commit = span(&spans, "commit", "event_id", id);
        assert_ne!(commit["trace_id"], TRACE_ID);
        let root = spans
            .iter()
            .find(|s| s["name"] == "request" && s["trace_id"] == commit["trace_id"])
            .unwrap_or_else(|| panic!("no request span for event {id}: {spans:#?}"));
        assert_eq!(root["parent_span_id"], "", "a fresh trace's root: {root:#}");
    }

    // What the logs may not carry, the spans do not either.
    let exported = serde_json::to_string(&spans).unwrap();
    for secret in [
        PHONE,
        key.as_str(),
        tenant.api_key.as_str(),
        tenant.webhook_secret.as_str(),
        tenant.signing_secret.as_str(),
    ] {
        assert!(!exported.contains(secret), "{secret} was exported");
    }
}

async fn with_the_variable_unset_nothing_is_exported_or_propagated(backend: Backend) {
    let db = TestDb::new(backend).await;
    let collector = Collector::start(db.dir());
    let callback = Receiver::start(vec![]).await;
    let cases = EffectReceiver::start(std::time::Duration::ZERO).await;
    let tenant = traced_tenant(&db, &callback.url, &cases.url);
    // Other OpenTelemetry variables alone do not turn traces on.
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("OTEL_SERVICE_NAME", "verdict-traces-test"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
        ],
    );
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let reply = send_traced(&server, &tenant, &new_key(), PHONE, Some(&traceparent)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(server.terminate(), "verdict serve did not stop cleanly");

    assert!(
        collector.requests().is_empty(),
        "{:?}",
        collector.requests()
    );
    let sent = callback.received();
    assert_eq!(sent.len(), 1);
    assert!(sent[0].headers.get("traceparent").is_none());
    let calls = cases.calls();
    assert_eq!(calls.len(), 1);
    assert!(calls[0].headers.get("traceparent").is_none());
}

async fn a_worker_retry_is_a_trace_of_its_own(backend: Backend) {
    let db = TestDb::new(backend).await;
    let collector = Collector::start(db.dir());
    let callback = Receiver::start(vec![Step::status(503)]).await;
    let tenant = db.tenant(&["--callback-url", &callback.url]);
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str());
    let mut env = MANUAL_WORKER.to_vec();
    env.push(endpoint);
    let server = Server::start(&db, &env);
    let traceparent = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let reply = send_traced(&server, &tenant, &new_key(), PHONE, Some(&traceparent)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    wait_for_next_round().await;
    let round = db.worker_once(&[("VERDICT_RETRY_INTERVAL_SECS", "1"), endpoint]);
    assert_eq!(round["delivered"], 1, "{round}");
    assert!(server.terminate(), "verdict serve did not stop cleanly");

    let spans = collector.spans();
    let inline = spans
        .iter()
        .find(|s| s["name"] == "callback" && s["trace_id"] == TRACE_ID)
        .unwrap_or_else(|| panic!("no inline callback span: {spans:#?}"));
    assert_eq!(inline["attributes"]["http.response.status_code"], 503);
    assert_eq!(inline["status"], "STATUS_CODE_ERROR");
    // The worker's attempt: a root of its own, not the long-gone request's.
    let attempt = span(&spans, "delivery", "trigger", "worker");
    assert_eq!(attempt["parent_span_id"], "", "{attempt:#}");
    assert_ne!(attempt["trace_id"], TRACE_ID);
    let retry = spans
        .iter()
        .find(|s| s["name"] == "callback" && s["parent_span_id"] == attempt["span_id"])
        .unwrap_or_else(|| panic!("no callback under the worker's attempt: {spans:#?}"));
    let sent = callback.received();
    assert_eq!(sent.len(), 2, "the inline attempt and the retry");
    assert_eq!(
        named_by(sent[1].header("traceparent")),
        (
            attempt["trace_id"].as_str().unwrap().to_owned(),
            retry["span_id"].as_str().unwrap().to_owned()
        )
    );
}

on_both_backends!(
    a_signal_is_one_trace_from_the_caller_to_the_tenants_systems,
    with_the_variable_unset_nothing_is_exported_or_propagated,
    a_worker_retry_is_a_trace_of_its_own,
);
