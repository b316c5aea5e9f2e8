//! Invalid or unauthenticated requests get the matching 4xx problem and never claim a key.

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};

/// Sends `req` and checks status, problem type, and that no key row and no event exist.
async fn refused(db: &TestDb, req: reqwest::RequestBuilder, status: u16, problem: &str) -> Reply {
    let reply = Reply::from(req.send().await.unwrap()).await;
    assert_eq!(
        reply.status,
        status,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.json()["type"],
        format!("https://verdict.dev/problems/{problem}")
    );
    assert_eq!(reply.json()["status"], status);
    assert_eq!(
        db.count("idempotency_keys").await,
        0,
        "a refused request claimed a key"
    );
    assert_eq!(db.count("events").await, 0);
    reply
}

fn post(server: &Server) -> reqwest::RequestBuilder {
    server.client.post(format!("{}/v1/signals", server.base))
}

fn setup_body() -> String {
    sim_swap("+447700900101")
}

async fn malformed_idempotency_keys_get_400(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let body = setup_body();
    for bad in [
        "\"unterminated",
        "has space",
        "\"\"",
        &"k".repeat(256),
        "\"a\\nb\"",
    ] {
        let req = signed(post(&server), &tenant, Some(bad), &body, now());
        refused(&db, req, 400, "invalid-idempotency-key").await;
    }
    let twice =
        signed(post(&server), &tenant, Some("one"), &body, now()).header("idempotency-key", "two");
    refused(&db, twice, 400, "invalid-idempotency-key").await;
}

async fn quoted_structured_field_key_is_the_same_key_as_bare(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let body = setup_body();
    let key = new_key();
    let bare = server.send(&tenant, Some(&key), &body).await;
    let quoted = server
        .send(&tenant, Some(&format!("\"{key}\"")), &body)
        .await;
    assert_eq!(bare.status, 200);
    assert!(quoted.replayed());
}

async fn invalid_bodies_get_400_415_or_413(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    for bad in [
        "{not json",
        r#"{"type":"sim_swap"}"#,
        r#"{"type":"weather","subject":{"account":"a"},"observed_at":"2026-11-30T00:00:00Z"}"#,
        r#"{"type":"sim_swap","subject":{"phone":"0044770"},"observed_at":"2026-11-30T00:00:00Z"}"#,
        r#"[1,2,3]"#,
    ] {
        let req = signed(post(&server), &tenant, Some(&key), bad, now());
        refused(&db, req, 400, "invalid-request").await;
    }
    let body = setup_body();
    let text = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "text/plain")
        .header("idempotency-key", &key)
        .body(body.clone());
    refused(&db, text, 415, "unsupported-media-type").await;
    let ambiguous = signed(post(&server), &tenant, Some(&key), &body, now())
        .header("content-type", "text/plain");
    refused(&db, ambiguous, 415, "unsupported-media-type").await;
    let none = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("idempotency-key", &key)
        .body(body.clone());
    refused(&db, none, 415, "unsupported-media-type").await;
    let huge = format!(
        r#"{{"type":"sim_swap","subject":{{"account":"a"}},"observed_at":"2026-11-30T00:00:00Z","metadata":{{"pad":"{}"}}}}"#,
        "x".repeat(70 * 1024)
    );
    let req = signed(post(&server), &tenant, Some(&key), &huge, now());
    refused(&db, req, 413, "payload-too-large").await;
}

async fn missing_or_wrong_credentials_get_401(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = setup_body();

    let no_api_key = post(&server)
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body.clone());
    let reply = refused(&db, no_api_key, 401, "invalid-api-key").await;
    assert!(reply.header("www-authenticate").is_some());

    let wrong_key = Tenant {
        api_key: "vk_not-a-real-key".into(),
        ..tenant.clone()
    };
    refused(
        &db,
        signed(post(&server), &wrong_key, Some(&key), &body, now()),
        401,
        "invalid-api-key",
    )
    .await;

    let unsigned = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .body(body.clone());
    refused(&db, unsigned, 401, "invalid-signature").await;

    let other_secret = Tenant {
        signing_secret: verdict_webhooks::Secret::generate().to_whsec(),
        ..tenant.clone()
    };
    refused(
        &db,
        signed(post(&server), &other_secret, Some(&key), &body, now()),
        401,
        "invalid-signature",
    )
    .await;

    // Signed correctly, but the body sent differs by one byte from the body signed.
    let secret = verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap();
    let ts = now();
    let tampered = body.replacen("abc-1", "abc-2", 1);
    let req = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", &key)
        .header("verdict-timestamp", ts.to_string())
        .header(
            "verdict-signature",
            secret.sign_content(format!("{ts}.{body}").as_bytes()),
        )
        .body(tampered);
    refused(&db, req, 401, "invalid-signature").await;

    refused(
        &db,
        signed(post(&server), &tenant, Some(&key), &body, now() - 301),
        401,
        "stale-timestamp",
    )
    .await;
    // Far enough ahead that a second passing before the server reads its clock (a busy CI
    // machine) still leaves it outside the 300 s tolerance.
    refused(
        &db,
        signed(post(&server), &tenant, Some(&key), &body, now() + 330),
        401,
        "stale-timestamp",
    )
    .await;

    // And the same request, properly signed, is then accepted: nothing was left behind.
    let ok = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(ok.status, 200);
    assert!(!ok.replayed());
}

async fn a_body_is_not_parsed_before_its_key_and_signature_are_checked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    // Thousands of members, not even valid JSON at the end: parsing it is the costly part,
    // and the answer shows whether it was parsed (400) or refused first (401).
    let members: Vec<String> = (0..4000).map(|i| format!(r#""m{i}":{i}"#)).collect();
    let costly = format!("{{{},", members.join(","));

    let no_api_key = post(&server)
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .body(costly.clone());
    refused(&db, no_api_key, 401, "invalid-api-key").await;
    let unsigned = post(&server)
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .header("idempotency-key", new_key())
        .body(costly.clone());
    refused(&db, unsigned, 401, "invalid-signature").await;
    // The CAMARA feed answers in CAMARA's own error format.
    let camara = server
        .client
        .post(format!("{}/v1/camara/sim-swap", server.base))
        .bearer_auth("vk_not-a-real-key")
        .header("content-type", "application/cloudevents+json")
        .body(costly.clone());
    let reply = Reply::from(camara.send().await.unwrap()).await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert_eq!(reply.json()["code"], "UNAUTHENTICATED");

    // Signed, the same bytes are parsed and refused for what they are.
    let req = signed(post(&server), &tenant, Some(&new_key()), &costly, now());
    refused(&db, req, 400, "invalid-request").await;
}

async fn tenant_without_inbound_signature_is_accepted_unsigned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &[]);
    let reply = Reply::from(
        post(&server)
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/json")
            .body(setup_body())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

async fn rotated_secret_keeps_the_old_one_valid_for_the_grace_period(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let out = db.cli(&[
        "tenant",
        "rotate-secret",
        "--tenant",
        &tenant.id,
        "--grace-secs",
        "2",
        "--json",
    ]);
    let new_secret = serde_json::from_str::<serde_json::Value>(&out).unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let rotated = Tenant {
        signing_secret: new_secret,
        ..tenant.clone()
    };
    let server = Server::start(&db, &[]);
    assert_eq!(
        server.send(&tenant, None, &setup_body()).await.status,
        200,
        "old secret in grace"
    );
    assert_eq!(
        server.send(&rotated, None, &setup_body()).await.status,
        200,
        "new secret"
    );
    tokio::time::sleep(std::time::Duration::from_millis(2200)).await;
    assert_eq!(
        server.send(&tenant, None, &setup_body()).await.status,
        401,
        "old secret retired"
    );
    assert_eq!(server.send(&rotated, None, &setup_body()).await.status, 200);
}

async fn health_readiness_and_a_valid_openapi_document_answer(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[]);
    for path in ["/healthz", "/readyz"] {
        let r = server
            .client
            .get(format!("{}{path}", server.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(r.headers().contains_key("x-request-id"));
    }
    let document = server.openapi().await;
    assert_eq!(document.status, 200);
    assert!(document.json()["paths"]["/v1/signals"]["post"].is_object());
    let mut check = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys\nfrom openapi_spec_validator import validate\nvalidate(json.load(sys.stdin))",
        ])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 is needed for the OpenAPI check");
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(&document.body)
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "/openapi.json is not valid OpenAPI (run `pip install openapi-spec-validator` if missing): {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let missing = Reply::from(
        server
            .client
            .get(format!("{}/nope", server.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.json()["type"],
        "https://verdict.dev/problems/not-found"
    );
}

async fn malformed_queries_paths_and_methods_get_problem_responses(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    for path in [
        "/v1/events?before=",
        "/v1/events?limit=-9223372036854775809",
        "/v1/events?limit=false",
        "/v1/deliveries?before=not-a-uuid",
        "/v1/deliveries?limit=9223372036854775808",
        "/v1/events/%FF",
        "/v1/subjects/%C3%28",
    ] {
        let r = server.get(&tenant, path).await;
        assert_eq!(r.status, 400, "{path}");
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{path}"
        );
        assert_eq!(
            r.json()["type"],
            "https://verdict.dev/problems/invalid-request",
            "{path}"
        );
    }
    // A well-formed id that names nothing is still 404, as another tenant's ids are.
    assert_eq!(
        server.get(&tenant, "/v1/events/not-a-uuid").await.status,
        404
    );

    let r = Reply::from(
        server
            .client
            .patch(format!("{}/v1/events", server.base))
            .bearer_auth(&tenant.api_key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 405);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.header("allow"), Some("GET,HEAD"));
    assert_eq!(
        r.json()["type"],
        "https://verdict.dev/problems/method-not-allowed"
    );
}

on_both_backends!(
    malformed_queries_paths_and_methods_get_problem_responses,
    malformed_idempotency_keys_get_400,
    quoted_structured_field_key_is_the_same_key_as_bare,
    invalid_bodies_get_400_415_or_413,
    missing_or_wrong_credentials_get_401,
    a_body_is_not_parsed_before_its_key_and_signature_are_checked,
    tenant_without_inbound_signature_is_accepted_unsigned,
    rotated_secret_keeps_the_old_one_valid_for_the_grace_period,
    health_readiness_and_a_valid_openapi_document_answer,
);
