//! The axum integration on a real socket, driven with reqwest.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::mpsc;
use verdict_receiver::{Event, MemoryDedupStore, PostgresDedupStore, Received, Receiver};
use verdict_webhooks::Secret;

use crate::common;
use crate::common::{body, envelope, signed};

fn secret() -> Secret {
    Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("test secret")
}

fn now() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_secs()).expect("seconds fit")
}

/// A router on a real socket whose handler reports each event on the returned channel.
async fn start(receiver: Receiver) -> (String, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = move |event: Event| {
        let tx = tx.clone();
        async move { tx.send(event).map_err(|_| "test ended") }
    };
    let url = common::serve(verdict_receiver::axum::router(receiver, handler)).await;
    (url, rx)
}

async fn started() -> (String, mpsc::UnboundedReceiver<Event>) {
    let receiver = Receiver::builder(MemoryDedupStore::new())
        .secret(secret())
        .build()
        .expect("receiver");
    start(receiver).await
}

async fn post(url: &str, headers: HeaderMap, body: &[u8]) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(url)
        .headers(headers)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .expect("request");
    let status = response.status();
    (status, response.text().await.expect("response text"))
}

/// The next event the handler saw, within a few seconds.
async fn next(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("the handler ran in time")
        .expect("channel open")
}

/// Whether the handler stays idle for a moment.
async fn stays_idle(events: &mut mpsc::UnboundedReceiver<Event>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), events.recv())
        .await
        .is_err()
}

#[tokio::test]
async fn a_new_event_is_answered_204_and_handled_once() {
    let (url, mut events) = started().await;
    let body = body(&envelope(1));
    let (status, _) = post(&url, signed(&secret(), "msg_1", now(), &body), &body).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let event = next(&mut events).await;
    assert_eq!(event.envelope, envelope(1));
    assert_eq!(event.body, body);
    assert_eq!(event.webhook_id.as_deref(), Some("msg_1"));
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn a_redelivery_of_an_old_valid_event_inside_the_horizon_is_answered_2xx_and_not_handled_again()
 {
    let store = MemoryDedupStore::new();
    let receiver = Receiver::builder(store.clone())
        .secret(secret())
        .build()
        .expect("receiver");
    let body = body(&envelope(1));
    // Received and handled two days ago, on this receiver's store.
    let then = now() - 48 * 3600;
    let headers = signed(&secret(), "msg_1", then, &body);
    match receiver.receive(&headers, &body, then).await {
        Ok(Received::New(event)) => receiver
            .process(event, &|_: Event| async { Ok::<_, Infallible>(()) })
            .await
            .expect("process"),
        other => panic!("expected a new event, got {other:?}"),
    }

    // An operator redelivers it: same webhook-id, fresh timestamp and signature.
    let (url, mut events) = start(receiver).await;
    let (status, _) = post(&url, signed(&secret(), "msg_1", now(), &body), &body).await;
    assert!(status.is_success(), "{status}");
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn the_same_tuple_under_a_different_webhook_id_is_answered_2xx_and_not_handled_again() {
    let (url, mut events) = started().await;
    let body = body(&envelope(1));
    post(&url, signed(&secret(), "msg_1", now(), &body), &body).await;
    next(&mut events).await;
    let (status, _) = post(&url, signed(&secret(), "msg_2", now(), &body), &body).await;
    assert!(status.is_success(), "{status}");
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn a_body_changed_by_one_byte_is_answered_401() {
    let (url, mut events) = started().await;
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", now(), &body);
    let mut tampered = body.clone();
    let last = tampered.len() - 2;
    tampered[last] ^= 0x01;
    let (status, text) = post(&url, headers, &tampered).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!text.is_empty());
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn a_signature_made_with_another_secret_is_answered_401() {
    let (url, mut events) = started().await;
    let body = body(&envelope(1));
    let headers = signed(&Secret::generate(), "msg_1", now(), &body);
    let (status, _) = post(&url, headers, &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn a_timestamp_outside_the_tolerance_is_answered_401_even_for_a_known_event() {
    let (url, mut events) = started().await;
    let body = body(&envelope(1));
    post(&url, signed(&secret(), "msg_1", now(), &body), &body).await;
    next(&mut events).await;
    // Clear of the boundary, so a second ticking over between here and the server cannot matter.
    for stale in [now() - 310, now() + 310] {
        let (status, text) = post(&url, signed(&secret(), "msg_1", stale, &body), &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(text.contains("timestamp"), "{text}");
    }
}

#[tokio::test]
async fn an_unsigned_request_is_answered_401_unless_allow_unsigned() {
    let body = body(&envelope(1));
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_static("msg_1"));

    let (url, mut events) = started().await;
    let (status, _) = post(&url, headers.clone(), &body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(stays_idle(&mut events).await);

    let lenient = Receiver::builder(MemoryDedupStore::new())
        .allow_unsigned()
        .build()
        .expect("receiver");
    let (url, mut events) = start(lenient).await;
    let (status, _) = post(&url, headers, &body).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(next(&mut events).await.envelope, envelope(1));
}

#[tokio::test]
async fn a_body_that_is_not_an_envelope_is_answered_400() {
    let (url, mut events) = started().await;
    let body = br#"{"not":"an envelope"}"#;
    let (status, _) = post(&url, signed(&secret(), "msg_1", now(), body), body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(stays_idle(&mut events).await);
}

#[tokio::test]
async fn an_unreachable_store_is_answered_503_so_the_sender_retries() {
    let pg = common::TestPg::new().await;
    let pool = sqlx::PgPool::connect(&pg.url).await.expect("connect");
    let store = PostgresDedupStore::new(pool.clone()).await.expect("store");
    let receiver = Receiver::builder(store)
        .secret(secret())
        .build()
        .expect("receiver");
    let (url, mut events) = start(receiver).await;
    pool.close().await;

    let body = body(&envelope(1));
    let (status, _) = post(&url, signed(&secret(), "msg_1", now(), &body), &body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(stays_idle(&mut events).await);
}
