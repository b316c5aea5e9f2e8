//! What every dedup store must do, written once and run against the memory, SQLite and
//! PostgreSQL stores.

use std::sync::Arc;

use uuid::Uuid;
use verdict_receiver::{DedupStore, Record, RecordOutcome, TupleDigest};

use crate::common;
use crate::common::envelope;

const T0: i64 = 1_780_000_000_000;
const HOUR: i64 = 3_600_000;
const LEASE: i64 = 300_000;

fn record(webhook_id: Option<&str>, n: u32, received_at_ms: i64) -> Record {
    let envelope = envelope(n);
    Record {
        id: Uuid::now_v7(),
        webhook_id: webhook_id.map(str::to_owned),
        tuple_digest: TupleDigest::of(&envelope),
        body: common::body(&envelope),
        received_at_ms,
        lease_until_ms: received_at_ms + LEASE,
    }
}

/// Records with a horizon of 72 h before `at_ms`.
async fn record_at(store: &dyn DedupStore, record: &Record, at_ms: i64) -> RecordOutcome {
    store
        .record(record, at_ms - 72 * HOUR)
        .await
        .expect("record")
}

async fn a_first_delivery_is_recorded_with_its_body_byte_for_byte(store: Arc<dyn DedupStore>) {
    let mut first = record(Some("msg_1"), 1, T0);
    first.body.extend_from_slice(b" \n\x00\xff");
    assert_eq!(
        record_at(&*store, &first, T0).await,
        RecordOutcome::Recorded
    );
    let pending = store
        .lease_pending(T0 + LEASE, T0 + 2 * LEASE, 10)
        .await
        .expect("lease");
    let expected = Record {
        lease_until_ms: T0 + 2 * LEASE,
        ..first
    };
    assert_eq!(pending, vec![expected]);
}

async fn the_same_webhook_id_again_is_a_duplicate(store: Arc<dyn DedupStore>) {
    let first = record(Some("msg_1"), 1, T0);
    assert_eq!(
        record_at(&*store, &first, T0).await,
        RecordOutcome::Recorded
    );
    // Same id, other tuple: the id alone makes it a duplicate.
    let again = record(Some("msg_1"), 2, T0 + HOUR);
    assert_eq!(
        record_at(&*store, &again, T0 + HOUR).await,
        RecordOutcome::Duplicate
    );
}

async fn the_same_tuple_under_another_webhook_id_is_a_duplicate(store: Arc<dyn DedupStore>) {
    let first = record(Some("msg_1"), 1, T0);
    assert_eq!(
        record_at(&*store, &first, T0).await,
        RecordOutcome::Recorded
    );
    let again = record(Some("msg_2"), 1, T0 + HOUR);
    assert_eq!(
        record_at(&*store, &again, T0 + HOUR).await,
        RecordOutcome::Duplicate
    );
}

async fn deliveries_without_a_webhook_id_are_deduplicated_on_their_tuple_alone(
    store: Arc<dyn DedupStore>,
) {
    let a = record(None, 1, T0);
    let b = record(None, 2, T0);
    assert_eq!(record_at(&*store, &a, T0).await, RecordOutcome::Recorded);
    assert_eq!(record_at(&*store, &b, T0).await, RecordOutcome::Recorded);
    let a_again = record(None, 1, T0 + 1);
    assert_eq!(
        record_at(&*store, &a_again, T0 + 1).await,
        RecordOutcome::Duplicate
    );
}

async fn a_processed_record_older_than_the_horizon_no_longer_makes_a_duplicate(
    store: Arc<dyn DedupStore>,
) {
    let first = record(Some("msg_1"), 1, T0);
    assert_eq!(
        record_at(&*store, &first, T0).await,
        RecordOutcome::Recorded
    );
    store.mark_processed(first.id, T0 + 1).await.expect("mark");
    let inside = T0 + 72 * HOUR;
    let again = record(Some("msg_1"), 1, inside);
    assert_eq!(
        record_at(&*store, &again, inside).await,
        RecordOutcome::Duplicate
    );
    let outside = T0 + 72 * HOUR + 1;
    let again = record(Some("msg_1"), 1, outside);
    assert_eq!(
        record_at(&*store, &again, outside).await,
        RecordOutcome::Recorded
    );
}

async fn an_unprocessed_record_still_makes_a_duplicate_after_the_horizon(
    store: Arc<dyn DedupStore>,
) {
    let first = record(Some("msg_1"), 1, T0);
    assert_eq!(
        record_at(&*store, &first, T0).await,
        RecordOutcome::Recorded
    );
    let later = T0 + 100 * HOUR;
    let again = record(Some("msg_1"), 1, later);
    assert_eq!(
        record_at(&*store, &again, later).await,
        RecordOutcome::Duplicate
    );
}

async fn prune_deletes_only_processed_records_older_than_the_horizon(store: Arc<dyn DedupStore>) {
    let old_done = record(Some("old_done"), 1, T0);
    let old_pending = record(Some("old_pending"), 2, T0);
    let fresh_done = record(Some("fresh_done"), 3, T0 + 10 * HOUR);
    for r in [&old_done, &old_pending, &fresh_done] {
        assert_eq!(
            record_at(&*store, r, r.received_at_ms).await,
            RecordOutcome::Recorded
        );
    }
    store.mark_processed(old_done.id, T0).await.expect("mark");
    store
        .mark_processed(fresh_done.id, T0 + 10 * HOUR)
        .await
        .expect("mark");

    let horizon_start = T0 + HOUR;
    assert_eq!(store.prune(horizon_start).await.expect("prune"), 1);
    assert_eq!(store.prune(horizon_start).await.expect("prune"), 0);

    // With a horizon that expires nothing, only a row that is really gone records afresh.
    let forgotten = record(Some("old_done"), 1, T0 + 2 * HOUR);
    assert_eq!(
        store.record(&forgotten, i64::MIN).await.expect("record"),
        RecordOutcome::Recorded
    );
    for (id, n) in [("old_pending", 2), ("fresh_done", 3)] {
        let again = record(Some(id), n, T0 + 2 * HOUR);
        assert_eq!(
            store.record(&again, i64::MIN).await.expect("record"),
            RecordOutcome::Duplicate
        );
    }
}

async fn a_pending_record_is_leased_to_one_taker_at_a_time(store: Arc<dyn DedupStore>) {
    let first = record(Some("msg_1"), 1, T0);
    record_at(&*store, &first, T0).await;

    // The receiving handler holds it until its lease ends.
    let during = store.lease_pending(T0 + LEASE - 1, T0 + 10 * LEASE, 10);
    assert!(during.await.expect("lease").is_empty());

    let taken = store.lease_pending(T0 + LEASE, T0 + 2 * LEASE, 10);
    assert_eq!(taken.await.expect("lease").len(), 1);
    let again = store.lease_pending(T0 + LEASE, T0 + 3 * LEASE, 10);
    assert!(again.await.expect("lease").is_empty());

    // The taker died: once its lease ends, the record is handed out again.
    let retaken = store.lease_pending(T0 + 2 * LEASE, T0 + 3 * LEASE, 10);
    assert_eq!(retaken.await.expect("lease").len(), 1);

    store
        .mark_processed(first.id, T0 + 2 * LEASE)
        .await
        .expect("mark");
    let after = store.lease_pending(T0 + 100 * LEASE, T0 + 101 * LEASE, 10);
    assert!(after.await.expect("lease").is_empty());
}

async fn pending_records_are_leased_oldest_first_up_to_the_limit(store: Arc<dyn DedupStore>) {
    let records: Vec<Record> = (0..5)
        .rev()
        .map(|n| record(Some(&format!("msg_{n}")), n, T0 + i64::from(n)))
        .collect();
    for r in &records {
        record_at(&*store, r, r.received_at_ms).await;
    }
    let now = T0 + 10 * LEASE;
    let first = store
        .lease_pending(now, now + LEASE, 3)
        .await
        .expect("lease");
    let ids: Vec<_> = first.iter().map(|r| r.webhook_id.as_deref()).collect();
    assert_eq!(ids, [Some("msg_0"), Some("msg_1"), Some("msg_2")]);
    let rest = store
        .lease_pending(now, now + LEASE, 3)
        .await
        .expect("lease");
    let ids: Vec<_> = rest.iter().map(|r| r.webhook_id.as_deref()).collect();
    assert_eq!(ids, [Some("msg_3"), Some("msg_4")]);
}

async fn marking_a_record_processed_twice_is_harmless(store: Arc<dyn DedupStore>) {
    let first = record(Some("msg_1"), 1, T0);
    record_at(&*store, &first, T0).await;
    store.mark_processed(first.id, T0).await.expect("mark");
    store.mark_processed(first.id, T0 + 1).await.expect("mark");
    store
        .mark_processed(Uuid::now_v7(), T0)
        .await
        .expect("mark unknown");
    let pending = store.lease_pending(T0 + 10 * LEASE, T0 + 11 * LEASE, 10);
    assert!(pending.await.expect("lease").is_empty());
}

async fn concurrent_deliveries_of_one_event_record_it_exactly_once(store: Arc<dyn DedupStore>) {
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = Arc::clone(&store);
            // Half collide on the webhook-id, half only on the tuple.
            let webhook_id = if i % 2 == 0 {
                "msg_1".to_owned()
            } else {
                format!("msg_other_{i}")
            };
            tokio::spawn(async move {
                let r = record(Some(&webhook_id), 1, T0);
                store.record(&r, T0 - 72 * HOUR).await
            })
        })
        .collect();
    let mut recorded = 0;
    for task in tasks {
        if task.await.expect("task").expect("record") == RecordOutcome::Recorded {
            recorded += 1;
        }
    }
    assert_eq!(recorded, 1);
}

for_each_store!(
    a_first_delivery_is_recorded_with_its_body_byte_for_byte,
    the_same_webhook_id_again_is_a_duplicate,
    the_same_tuple_under_another_webhook_id_is_a_duplicate,
    deliveries_without_a_webhook_id_are_deduplicated_on_their_tuple_alone,
    a_processed_record_older_than_the_horizon_no_longer_makes_a_duplicate,
    an_unprocessed_record_still_makes_a_duplicate_after_the_horizon,
    prune_deletes_only_processed_records_older_than_the_horizon,
    a_pending_record_is_leased_to_one_taker_at_a_time,
    pending_records_are_leased_oldest_first_up_to_the_limit,
    marking_a_record_processed_twice_is_harmless,
    concurrent_deliveries_of_one_event_record_it_exactly_once,
);
