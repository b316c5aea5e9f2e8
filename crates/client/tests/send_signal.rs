//! The client against a real HTTP server on 127.0.0.1.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;
use verdict_client::ClientError;
use verdict_webhooks::{Secret, signature_matches};

use common::{DECISION, Reply, TestServer, client};

fn signal(n: u32) -> Value {
    json!({
        "type": "sim_swap",
        "subject": {"phone": format!("+4477009001{n:02}")},
        "observed_at": "2026-05-28T12:00:00Z",
        "attributes": {},
        "metadata": {"n": n}
    })
}

fn secret() -> Secret {
    Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("test secret")
}

/// Whether the request's signature verifies with `secret` over `"{timestamp}.{body}"`.
fn signature_verifies(seen: &common::Seen, secret: &Secret) -> bool {
    let timestamp = seen.header("verdict-timestamp");
    let mut content = format!("{timestamp}.").into_bytes();
    content.extend_from_slice(&seen.body);
    signature_matches(
        std::slice::from_ref(secret),
        &content,
        seen.header("verdict-signature"),
    )
}

#[tokio::test]
async fn a_503_then_200_is_two_attempts_with_the_same_key_and_the_same_bytes() {
    let server = TestServer::start(vec![Reply::status(503)]).await;
    let client = client(&server.url)
        .signing_secret(secret())
        .build()
        .expect("client");
    let outcome = client.send_signal(&signal(1)).await.expect("accepted");

    assert_eq!(outcome.status, 200);
    assert_eq!(outcome.attempts, 2);
    assert_eq!(
        outcome.body,
        serde_json::from_str::<Value>(DECISION).unwrap()
    );
    assert!(!outcome.replayed);
    let [first, second] = &server.requests()[..] else {
        panic!("expected two requests, got {:?}", server.requests());
    };
    assert_eq!(first.header("idempotency-key"), outcome.idempotency_key);
    assert_eq!(second.header("idempotency-key"), outcome.idempotency_key);
    assert_eq!(first.body, second.body);
    assert_eq!(first.body, serde_json::to_vec(&signal(1)).unwrap());
    for seen in [first, second] {
        assert_eq!(seen.header("authorization"), "Bearer vk_test_key");
        assert_eq!(seen.header("content-type"), "application/json");
        assert!(signature_verifies(seen, &secret()));
    }
}

#[tokio::test]
async fn a_connection_dropped_without_a_response_is_retried_with_the_same_key_and_bytes() {
    let server = TestServer::start_dropping_first(Vec::new()).await;
    let client = client(&server.url)
        .signing_secret(secret())
        .build()
        .expect("client");
    let outcome = client.send_signal(&signal(1)).await.expect("accepted");

    assert_eq!(outcome.attempts, 2);
    let [dropped, answered] = &server.requests()[..] else {
        panic!("expected two requests, got {:?}", server.requests());
    };
    assert_eq!(dropped.header("idempotency-key"), outcome.idempotency_key);
    assert_eq!(answered.header("idempotency-key"), outcome.idempotency_key);
    assert_eq!(dropped.body, answered.body);
    assert!(signature_verifies(dropped, &secret()));
    assert!(signature_verifies(answered, &secret()));
}

#[tokio::test]
async fn a_409_waits_for_retry_after_then_retries_with_a_fresh_signature() {
    let server = TestServer::start(vec![Reply::status(409).header("retry-after", "1")]).await;
    let client = client(&server.url)
        .signing_secret(secret())
        .build()
        .expect("client");
    let outcome = client.send_signal(&signal(1)).await.expect("accepted");

    assert_eq!(outcome.attempts, 2);
    let [first, second] = &server.requests()[..] else {
        panic!("expected two requests, got {:?}", server.requests());
    };
    assert!(
        second.at.duration_since(first.at) >= Duration::from_secs(1),
        "retried after {:?}",
        second.at.duration_since(first.at)
    );
    assert_eq!(
        first.header("idempotency-key"),
        second.header("idempotency-key")
    );
    assert_eq!(first.body, second.body);
    // Each attempt is signed at its own time.
    let t1: i64 = first.header("verdict-timestamp").parse().unwrap();
    let t2: i64 = second.header("verdict-timestamp").parse().unwrap();
    assert!(t2 > t1, "{t1} then {t2}");
    assert!(signature_verifies(second, &secret()));
}

#[tokio::test]
async fn a_422_is_reported_as_a_reused_key_without_a_retry() {
    let problem = r#"{"type":"https://verdict.dev/problems/idempotency-key-reused","title":"Idempotency key reused","status":422}"#;
    let server = TestServer::start(vec![Reply::json(422, problem)]).await;
    let client = client(&server.url).build().expect("client");
    let err = client.send_signal(&signal(1)).await.unwrap_err();

    assert_eq!(server.requests().len(), 1);
    let key = server.requests()[0].header("idempotency-key").to_owned();
    match &err {
        ClientError::KeyReusedWithDifferentBody {
            idempotency_key,
            problem: body,
        } => {
            assert_eq!(*idempotency_key, key);
            assert_eq!(*body, serde_json::from_str::<Value>(problem).unwrap());
        }
        other => panic!("expected KeyReusedWithDifferentBody, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("idempotency key was reused with a different body"),
        "{message}"
    );
    assert!(message.contains("key-generation bug"), "{message}");
}

#[tokio::test]
async fn a_400_is_rejected_with_its_problem_without_a_retry() {
    let problem = r#"{"type":"https://verdict.dev/problems/invalid-signal","title":"Invalid signal","status":400}"#;
    let server = TestServer::start(vec![Reply::json(400, problem)]).await;
    let client = client(&server.url).build().expect("client");
    let err = client.send_signal(&signal(1)).await.unwrap_err();

    assert_eq!(server.requests().len(), 1);
    match &err {
        ClientError::Rejected {
            status,
            problem: body,
        } => {
            assert_eq!(*status, 400);
            assert_eq!(*body, serde_json::from_str::<Value>(problem).unwrap());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(err.to_string().contains("Invalid signal"), "{err}");
}

#[tokio::test]
async fn two_different_signals_get_two_different_random_keys() {
    let server = TestServer::start(Vec::new()).await;
    let client = client(&server.url).build().expect("client");
    let a = client.send_signal(&signal(1)).await.expect("accepted");
    let b = client.send_signal(&signal(2)).await.expect("accepted");
    // The same signal sent twice through the API is also two signals: keys are never derived.
    let c = client.send_signal(&signal(1)).await.expect("accepted");

    let keys: HashSet<_> = [&a, &b, &c]
        .iter()
        .map(|o| o.idempotency_key.clone())
        .collect();
    assert_eq!(keys.len(), 3);
    for key in &keys {
        let uuid = Uuid::parse_str(key).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 4);
    }
    let sent: Vec<_> = server
        .requests()
        .iter()
        .map(|s| s.header("idempotency-key").to_owned())
        .collect();
    assert_eq!(
        sent,
        [&a, &b, &c].map(|o| o.idempotency_key.clone()).to_vec()
    );
}

#[tokio::test]
async fn the_signature_covers_the_key_and_verifies_over_timestamp_dot_body() {
    let server = TestServer::start(Vec::new()).await;
    let client = client(&server.url)
        .signing_secret(secret())
        .build()
        .expect("client");
    let body = br#"{"type":"port_out","subject":{"account":"a-1"}}"#;
    client.send_signal_bytes(body).await.expect("accepted");

    let seen = &server.requests()[0];
    assert_eq!(seen.body, body);
    let timestamp: i64 = seen.header("verdict-timestamp").parse().expect("integer");
    let key = seen.header("idempotency-key");
    // `v2` over the key too, for tenants that require it; `v1` beside it for older ones.
    let expected = format!(
        "{} {}",
        secret().sign_content_as(
            "v2",
            &[format!("{timestamp}.{key}.").as_bytes(), body].concat()
        ),
        secret().sign_content(&[format!("{timestamp}.").as_bytes(), body].concat())
    );
    assert_eq!(seen.header("verdict-signature"), expected);
    assert!(signature_verifies(seen, &secret()));
    assert!(!signature_verifies(seen, &Secret::generate()));
}

#[tokio::test]
async fn without_a_signing_secret_no_signature_headers_are_sent() {
    let server = TestServer::start(Vec::new()).await;
    let client = client(&server.url).build().expect("client");
    client.send_signal(&signal(1)).await.expect("accepted");
    let seen = &server.requests()[0];
    assert!(seen.headers.get("verdict-signature").is_none());
    assert!(seen.headers.get("verdict-timestamp").is_none());
}

#[tokio::test]
async fn a_replayed_answer_is_reported_as_replayed() {
    let server = TestServer::start(vec![
        Reply::json(200, DECISION).header("idempotent-replayed", "true"),
    ])
    .await;
    let client = client(&server.url).build().expect("client");
    let outcome = client.send_signal(&signal(1)).await.expect("accepted");
    assert!(outcome.replayed);
    assert_eq!(outcome.attempts, 1);
}

#[tokio::test]
async fn retries_stop_at_max_attempts_and_report_the_key_to_resend_with() {
    let script = vec![Reply::status(503); 3];
    let server = TestServer::start(script).await;
    let client = client(&server.url).max_attempts(3).build().expect("client");
    let body = serde_json::to_vec(&signal(1)).unwrap();
    let err = client.send_signal_bytes(&body).await.unwrap_err();

    assert_eq!(server.requests().len(), 3);
    let ClientError::Unavailable {
        status,
        attempts,
        idempotency_key,
        ..
    } = err
    else {
        panic!("expected Unavailable, got {err:?}");
    };
    assert_eq!((status, attempts), (503, 3));

    // Resending later with that key carries the same key and bytes.
    let outcome = client
        .resend_signal_bytes(&body, &idempotency_key)
        .await
        .expect("accepted");
    assert_eq!(outcome.idempotency_key, idempotency_key);
    let requests = server.requests();
    assert!(requests.iter().all(|s| s.body == body));
    assert!(
        requests
            .iter()
            .all(|s| s.header("idempotency-key") == idempotency_key)
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_network_error_after_max_attempts() {
    // A port that was just free: nothing listens there.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let client = client(&url).max_attempts(3).build().expect("client");
    let err = client.send_signal(&signal(1)).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Network { attempts: 3, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_resend_with_an_invalid_key_is_refused_before_sending() {
    let server = TestServer::start(Vec::new()).await;
    let client = client(&server.url).build().expect("client");
    for key in ["", "has space", &"k".repeat(256)] {
        let err = client.resend_signal_bytes(b"{}", key).await.unwrap_err();
        assert!(matches!(err, ClientError::InvalidKey), "{key:?}: {err:?}");
    }
    assert!(server.requests().is_empty());
}
