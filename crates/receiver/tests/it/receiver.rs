//! The framework-free core: authenticate, parse, deduplicate, process, recover.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderValue};
use verdict_receiver::{
    Event, MemoryDedupStore, ReceiveError, Received, Receiver, Recovered, SqliteDedupStore,
};
use verdict_webhooks::{Secret, VerifyError};

use crate::common;
use crate::common::{NOW, body, count, envelope, recording_handler, signed};

fn secret() -> Secret {
    Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("test secret")
}

fn receiver(store: MemoryDedupStore) -> Receiver {
    Receiver::builder(store)
        .secret(secret())
        .build()
        .expect("receiver")
}

/// The event inside a `Received::New`, or a panic naming what came instead.
fn new_event(received: Result<Received, ReceiveError>) -> Event {
    match received {
        Ok(Received::New(event)) => event,
        other => panic!("expected a new event, got {other:?}"),
    }
}

fn is_duplicate(received: &Result<Received, ReceiveError>) -> bool {
    matches!(received, Ok(Received::Duplicate))
}

#[tokio::test]
async fn a_correctly_signed_envelope_is_new_and_carries_the_envelope_bytes_and_id() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    let event = new_event(receiver.receive(&headers, &body, NOW).await);
    assert_eq!(event.envelope, envelope(1));
    assert_eq!(event.body, body);
    assert_eq!(event.webhook_id.as_deref(), Some("msg_1"));
}

#[tokio::test]
async fn a_body_changed_by_one_byte_is_refused() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    let mut tampered = body.clone();
    let at = tampered.len() / 2;
    tampered[at] ^= 0x01;
    let result = receiver.receive(&headers, &tampered, NOW).await;
    assert!(matches!(
        result,
        Err(ReceiveError::Unauthenticated(
            VerifyError::NoMatchingSignature
        ))
    ));
}

#[tokio::test]
async fn a_signature_made_with_another_secret_is_refused() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let headers = signed(&Secret::generate(), "msg_1", NOW, &body);
    let result = receiver.receive(&headers, &body, NOW).await;
    assert!(matches!(
        result,
        Err(ReceiveError::Unauthenticated(
            VerifyError::NoMatchingSignature
        ))
    ));
}

#[tokio::test]
async fn a_timestamp_outside_the_tolerance_is_refused_as_stale() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    for (signed_at, expected) in [
        (NOW - 301, VerifyError::TimestampTooOld),
        (NOW + 301, VerifyError::TimestampTooNew),
    ] {
        let headers = signed(&secret(), "msg_1", signed_at, &body);
        let result = receiver.receive(&headers, &body, NOW).await;
        assert!(
            matches!(&result, Err(ReceiveError::Stale(e)) if *e == expected),
            "{result:?}"
        );
    }
    // Exactly at the tolerance is still fresh.
    let headers = signed(&secret(), "msg_1", NOW - 300, &body);
    new_event(receiver.receive(&headers, &body, NOW).await);
}

#[tokio::test]
async fn the_tolerance_is_configurable() {
    let receiver = Receiver::builder(MemoryDedupStore::new())
        .secret(secret())
        .tolerance(Duration::from_secs(10))
        .build()
        .expect("receiver");
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW - 11, &body);
    let result = receiver.receive(&headers, &body, NOW).await;
    assert!(matches!(result, Err(ReceiveError::Stale(_))));
}

#[tokio::test]
async fn a_stale_duplicate_is_refused_as_stale_not_discarded_as_a_duplicate() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    new_event(receiver.receive(&headers, &body, NOW).await);
    // The very same signed request, replayed after the tolerance.
    let result = receiver.receive(&headers, &body, NOW + 301).await;
    assert!(matches!(result, Err(ReceiveError::Stale(_))), "{result:?}");
}

#[tokio::test]
async fn a_redelivery_of_an_old_event_with_a_fresh_timestamp_is_a_duplicate() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let first = signed(&secret(), "msg_1", NOW, &body);
    new_event(receiver.receive(&first, &body, NOW).await);
    // Redelivered by hand two days later: same id, new timestamp and signature.
    let later = NOW + 48 * 3600;
    let again = signed(&secret(), "msg_1", later, &body);
    assert!(is_duplicate(&receiver.receive(&again, &body, later).await));
}

#[tokio::test]
async fn the_same_tuple_under_a_different_webhook_id_is_a_duplicate() {
    let receiver = receiver(MemoryDedupStore::new());
    let body = body(&envelope(1));
    let first = signed(&secret(), "msg_1", NOW, &body);
    new_event(receiver.receive(&first, &body, NOW).await);
    let other_id = signed(&secret(), "msg_2", NOW + 60, &body);
    assert!(is_duplicate(
        &receiver.receive(&other_id, &body, NOW + 60).await
    ));
}

#[tokio::test]
async fn a_processed_event_redelivered_after_the_horizon_is_new_again() {
    let receiver = Receiver::builder(MemoryDedupStore::new())
        .secret(secret())
        .horizon(Duration::from_secs(3600))
        .build()
        .expect("receiver");
    let (handler, seen) = recording_handler();
    let body = body(&envelope(1));
    let first = signed(&secret(), "msg_1", NOW, &body);
    let event = new_event(receiver.receive(&first, &body, NOW).await);
    receiver.process(event, &handler).await.expect("process");
    let later = NOW + 3601;
    let again = signed(&secret(), "msg_1", later, &body);
    new_event(receiver.receive(&again, &body, later).await);
    assert_eq!(count(&seen), 1);
}

#[tokio::test]
async fn an_unsigned_request_is_refused_unless_allow_unsigned() {
    let body = body(&envelope(1));
    let mut headers = HeaderMap::new();
    headers.insert("webhook-id", HeaderValue::from_static("msg_1"));
    headers.insert(
        "webhook-timestamp",
        HeaderValue::from_str(&NOW.to_string()).unwrap(),
    );

    let strict = receiver(MemoryDedupStore::new());
    let result = strict.receive(&headers, &body, NOW).await;
    assert!(matches!(
        result,
        Err(ReceiveError::Unauthenticated(VerifyError::MissingHeader(
            "webhook-signature"
        )))
    ));

    let lenient = Receiver::builder(MemoryDedupStore::new())
        .allow_unsigned()
        .build()
        .expect("receiver");
    let event = new_event(lenient.receive(&headers, &body, NOW).await);
    assert_eq!(event.webhook_id.as_deref(), Some("msg_1"));
}

#[tokio::test]
async fn unsigned_deliveries_without_an_id_are_deduplicated_on_their_tuple() {
    let receiver = Receiver::builder(MemoryDedupStore::new())
        .allow_unsigned()
        .build()
        .expect("receiver");
    let body = body(&envelope(1));
    let event = new_event(receiver.receive(&HeaderMap::new(), &body, NOW).await);
    assert_eq!(event.webhook_id, None);
    assert!(is_duplicate(
        &receiver.receive(&HeaderMap::new(), &body, NOW).await
    ));
}

#[tokio::test]
async fn a_wrong_signature_is_refused_even_when_unsigned_requests_are_allowed() {
    let receiver = Receiver::builder(MemoryDedupStore::new())
        .secret(secret())
        .allow_unsigned()
        .build()
        .expect("receiver");
    let body = body(&envelope(1));
    let headers = signed(&Secret::generate(), "msg_1", NOW, &body);
    let result = receiver.receive(&headers, &body, NOW).await;
    assert!(matches!(result, Err(ReceiveError::Unauthenticated(_))));
}

#[tokio::test]
async fn a_body_that_is_not_an_envelope_is_refused_and_not_recorded() {
    let receiver = receiver(MemoryDedupStore::new());
    let not_envelope = br#"{"hello":"secret-ish value"}"#;
    let headers = signed(&secret(), "msg_1", NOW, not_envelope);
    let err = match receiver.receive(&headers, not_envelope, NOW).await {
        Err(err @ ReceiveError::NotAnEnvelope { .. }) => err,
        other => panic!("expected NotAnEnvelope, got {other:?}"),
    };
    assert!(!err.to_string().contains("secret-ish"));
    assert!(!format!("{err:?}").contains("secret-ish"));
    // Nothing was recorded under that id.
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    new_event(receiver.receive(&headers, &body, NOW).await);
}

#[tokio::test]
async fn a_receiver_without_a_secret_is_refused_unless_allow_unsigned() {
    let result = Receiver::builder(MemoryDedupStore::new()).build();
    assert!(matches!(result, Err(ReceiveError::Config(_))));
}

#[tokio::test]
async fn a_horizon_shorter_than_twice_the_tolerance_is_refused() {
    let result = Receiver::builder(MemoryDedupStore::new())
        .secret(secret())
        .horizon(Duration::from_secs(599))
        .build();
    assert!(matches!(result, Err(ReceiveError::Config(_))));
}

#[tokio::test]
async fn a_receiver_restarted_between_two_deliveries_with_the_sqlite_store_discards_the_second() {
    let dir = common::TempDir::new();
    let path = dir.path().join("received.db");
    let body = body(&envelope(1));
    {
        let store = SqliteDedupStore::open(&path).await.expect("open");
        let first = Receiver::builder(store.clone())
            .secret(secret())
            .build()
            .expect("receiver");
        let headers = signed(&secret(), "msg_1", NOW, &body);
        new_event(first.receive(&headers, &body, NOW).await);
        store.pool().close().await;
    }
    let store = SqliteDedupStore::open(&path).await.expect("reopen");
    let restarted = Receiver::builder(store)
        .secret(secret())
        .build()
        .expect("receiver");
    let later = NOW + 600;
    let headers = signed(&secret(), "msg_1", later, &body);
    assert!(is_duplicate(
        &restarted.receive(&headers, &body, later).await
    ));
}

#[tokio::test]
async fn a_crash_between_record_and_handler_is_recovered_exactly_once() {
    let dir = common::TempDir::new();
    let path = dir.path().join("received.db");
    let body = body(&envelope(1));
    {
        let store = SqliteDedupStore::open(&path).await.expect("open");
        let crashed = Receiver::builder(store.clone())
            .secret(secret())
            .build()
            .expect("receiver");
        let headers = signed(&secret(), "msg_1", NOW, &body);
        // Answered 2xx, then the process died before the handler ran.
        new_event(crashed.receive(&headers, &body, NOW).await);
        store.pool().close().await;
    }
    let store = SqliteDedupStore::open(&path).await.expect("reopen");
    let restarted = Receiver::builder(store)
        .secret(secret())
        .build()
        .expect("receiver");
    let (handler, seen) = recording_handler();

    // While the dead handler's lease runs, recovery leaves the event alone.
    let early = restarted
        .recover(&handler, NOW + 10)
        .await
        .expect("recover");
    assert_eq!(early, Recovered::default());

    let after_lease = NOW + 301;
    let first = restarted
        .recover(&handler, after_lease)
        .await
        .expect("recover");
    assert_eq!(
        first,
        Recovered {
            handled: 1,
            failed: 0
        }
    );
    let again = restarted
        .recover(&handler, after_lease + 3600)
        .await
        .expect("recover");
    assert_eq!(again, Recovered::default());

    let seen = seen.lock().expect("seen lock");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].envelope, envelope(1));
    assert_eq!(seen[0].body, body);
    assert_eq!(seen[0].webhook_id.as_deref(), Some("msg_1"));
}

#[tokio::test]
async fn a_processed_event_is_never_handed_to_recovery() {
    let receiver = receiver(MemoryDedupStore::new());
    let (handler, seen) = recording_handler();
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    let event = new_event(receiver.receive(&headers, &body, NOW).await);
    receiver.process(event, &handler).await.expect("process");
    let recovered = receiver
        .recover(&handler, NOW + 3600)
        .await
        .expect("recover");
    assert_eq!(recovered, Recovered::default());
    assert_eq!(count(&seen), 1);
}

#[tokio::test]
async fn a_failing_handler_leaves_the_event_pending_until_it_succeeds() {
    let receiver = receiver(MemoryDedupStore::new());
    let calls = Arc::new(AtomicUsize::new(0));
    let handler = {
        let calls = Arc::clone(&calls);
        move |_event: Event| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if call == 0 {
                    Err("downstream unavailable")
                } else {
                    Ok(())
                }
            }
        }
    };
    let body = body(&envelope(1));
    let headers = signed(&secret(), "msg_1", NOW, &body);
    let event = new_event(receiver.receive(&headers, &body, NOW).await);
    let result = receiver.process(event, &handler).await;
    assert!(matches!(result, Err(ReceiveError::Handler(_))));

    let recovered = receiver
        .recover(&handler, NOW + 301)
        .await
        .expect("recover");
    assert_eq!(
        recovered,
        Recovered {
            handled: 1,
            failed: 0
        }
    );
    let recovered = receiver
        .recover(&handler, NOW + 3600)
        .await
        .expect("recover");
    assert_eq!(recovered, Recovered::default());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
