//! What a receiver refuses before doing any real work: a body over the size limit (413 from the
//! axum integration, never handled) and a `webhook-signature` stuffed with more than eight
//! entries (refused before any HMAC, even when one of them matches).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};
use tokio::sync::mpsc;
use verdict_receiver::{
    DEFAULT_MAX_BODY_BYTES, Event, MemoryDedupStore, ReceiveError, Received, Receiver,
};
use verdict_webhooks::{MAX_SIGNATURES, Secret, VerifyError};

use crate::common;
use crate::common::{NOW, body, envelope, signed};

fn secret() -> Secret {
    Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("test secret")
}

fn now() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_secs()).expect("seconds fit")
}

/// An envelope whose JSON body is exactly `size` bytes.
fn body_of_size(size: usize) -> Vec<u8> {
    let mut e = envelope(1);
    e.metadata = serde_json::json!({ "pad": "" });
    let padded = body(&e).len();
    assert!(size >= padded);
    e.metadata = serde_json::json!({ "pad": "x".repeat(size - padded) });
    let out = body(&e);
    assert_eq!(out.len(), size);
    out
}

/// A router on a real socket whose handler reports each event.
async fn start(receiver: Receiver) -> (String, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let handler = move |event: Event| {
        let tx = tx.clone();
        async move { tx.send(event).map_err(|_| "test ended") }
    };
    let url = common::serve(verdict_receiver::axum::router(receiver, handler)).await;
    (url, rx)
}

fn receiver() -> verdict_receiver::ReceiverBuilder {
    Receiver::builder(MemoryDedupStore::new()).secret(secret())
}

async fn post(url: &str, headers: HeaderMap, body: Vec<u8>) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(url)
        .headers(headers)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request");
    let status = response.status();
    (status, response.text().await.unwrap_or_default())
}

async fn handled(events: &mut mpsc::UnboundedReceiver<Event>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), events.recv())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_body_over_1_mib_gets_a_413_and_is_never_handled_while_1_mib_is_accepted() {
    assert_eq!(DEFAULT_MAX_BODY_BYTES, 1024 * 1024);
    let (url, mut events) = start(receiver().build().expect("receiver")).await;

    let over = body_of_size(DEFAULT_MAX_BODY_BYTES + 1);
    let headers = signed(&secret(), "msg_big", now(), &over);
    let (status, text) = post(&url, headers, over).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(text, "webhook body too large");
    assert!(!handled(&mut events).await);

    let exact = body_of_size(DEFAULT_MAX_BODY_BYTES);
    let headers = signed(&secret(), "msg_exact", now(), &exact);
    let (status, _) = post(&url, headers, exact.clone()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let event = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("handled in time")
        .expect("channel open");
    assert_eq!(event.body, exact);
}

#[tokio::test]
async fn the_limit_is_set_in_the_builder_and_held_by_receive_too() {
    let small = receiver().max_body_bytes(2048).build().expect("receiver");
    let big = body_of_size(4096);
    let headers = signed(&secret(), "msg_1", NOW, &big);
    match small.receive(&headers, &big, NOW).await {
        Err(ReceiveError::TooLarge { limit: 2048 }) => {}
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let fits = body_of_size(2048);
    let headers = signed(&secret(), "msg_2", NOW, &fits);
    assert!(matches!(
        small.receive(&headers, &fits, NOW).await,
        Ok(Received::New(_))
    ));

    // On a fresh store: the one above holds an unprocessed event recovery would hand over.
    let small = receiver().max_body_bytes(2048).build().expect("receiver");
    let (url, mut events) = start(small).await;
    let headers = signed(&secret(), "msg_3", now(), &big);
    assert_eq!(
        post(&url, headers, big).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert!(!handled(&mut events).await);

    assert!(matches!(
        receiver().max_body_bytes(0).build(),
        Err(ReceiveError::Config(_))
    ));
}

/// `n` signatures, the last the right one, the others made with another secret.
fn stuffed(n: usize, webhook_id: &str, timestamp: i64, body: &[u8]) -> HeaderMap {
    let mut headers = signed(&secret(), webhook_id, timestamp, body);
    let right = headers["webhook-signature"].to_str().unwrap().to_owned();
    let wrong = Secret::from_bytes(b"someone else".to_vec()).sign(webhook_id, timestamp, body);
    let mut entries = vec![wrong; n - 1];
    entries.push(right);
    headers.insert(
        "webhook-signature",
        HeaderValue::from_str(&entries.join(" ")).unwrap(),
    );
    headers
}

#[tokio::test]
async fn more_than_8_signature_entries_are_refused_even_with_the_right_one_among_them() {
    assert_eq!(MAX_SIGNATURES, 8);
    let receiver = receiver().build().expect("receiver");
    let body = body(&envelope(1));
    let nine = stuffed(9, "msg_1", NOW, &body);
    match receiver.receive(&nine, &body, NOW).await {
        Err(ReceiveError::Unauthenticated(VerifyError::TooManySignatures)) => {}
        other => panic!("expected TooManySignatures, got {other:?}"),
    }

    let (url, mut events) = start(receiver).await;
    let nine = stuffed(9, "msg_2", now(), &body);
    assert_eq!(
        post(&url, nine, body.clone()).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert!(!handled(&mut events).await);
    let eight = stuffed(8, "msg_3", now(), &body);
    assert_eq!(post(&url, eight, body).await.0, StatusCode::NO_CONTENT);
    assert!(handled(&mut events).await);
}
