//! A signal's callback delivery as the API shows it, and the worker's rounds.

use std::time::Duration;

use serde_json::Value;

use super::{Reply, Server, Tenant};

/// The delivery (with its attempts) of the event a signal reply names, once its inline attempt
/// is recorded: the record joins a group commit after the response, so it may land a moment
/// later. A delivery with no attempt after 3 s is returned as it is.
pub async fn delivery_of(server: &Server, tenant: &Tenant, reply: &Reply) -> Value {
    with_attempts(server, tenant, reply, 1, 30)
        .await
        .unwrap_or_else(|last| last)
}

/// The delivery once at least `n` attempts are recorded, polled `tries` times 100 ms apart;
/// `Err` with the last one read if they never were.
async fn with_attempts(
    server: &Server,
    tenant: &Tenant,
    reply: &Reply,
    n: usize,
    tries: usize,
) -> Result<Value, Value> {
    let mut d = delivery_now(server, tenant, reply).await;
    for _ in 0..tries {
        if d["attempts"].as_array().unwrap().len() >= n {
            return Ok(d);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        d = delivery_now(server, tenant, reply).await;
    }
    Err(d)
}

/// The delivery of the event a signal reply names, as it is now.
pub async fn delivery_now(server: &Server, tenant: &Tenant, reply: &Reply) -> Value {
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();
    let event = server.event(tenant, &event_id).await;
    let id = event["deliveries"][0]["id"].as_str().unwrap().to_owned();
    let detail = server.get(tenant, &format!("/v1/deliveries/{id}")).await;
    let text = String::from_utf8_lossy(&detail.body);
    assert_eq!(
        text.matches("\"attempts\":").count(),
        1,
        "one `attempts` member, the list: {text}"
    );
    detail.json()
}

/// The delivery once `n` attempts are recorded (an attempt past the inline deadline records
/// itself in the background).
pub async fn delivery_after(server: &Server, tenant: &Tenant, reply: &Reply, n: usize) -> Value {
    with_attempts(server, tenant, reply, n, 100)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "fewer than {n} attempts were recorded for event {}",
                reply.json()["event_id"]
            )
        })
}

/// Waits out one retry interval of a worker run with `VERDICT_RETRY_INTERVAL_SECS=1`, so that
/// its next round finds the retry due.
pub async fn wait_for_next_round() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}
