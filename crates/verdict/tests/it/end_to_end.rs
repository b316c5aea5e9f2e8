//! End to end over real sockets: client library → `verdict serve` → callback → receiver
//! library, with the network failing at each hop in turn. The integrator's handler runs
//! exactly once per signal and the server holds exactly one event.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;
use crate::common::proxy::{Fault, Proxy};
use crate::common::{Backend, MANUAL_WORKER, Server, TestDb, sim_swap};
use verdict_client::Client;
use verdict_receiver::{Event, MemoryDedupStore, Receiver};
use verdict_webhooks::Secret;

/// The integrator's side: a receiver whose handler records each event it is handed.
struct Integrator {
    addr: String,
    handled: Arc<Mutex<Vec<String>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Integrator {
    async fn start(webhook_secret: &str) -> Integrator {
        let receiver = Receiver::builder(MemoryDedupStore::new())
            .secret(Secret::parse(webhook_secret).unwrap())
            .build()
            .unwrap();
        let handled = Arc::new(Mutex::new(Vec::new()));
        let sink = handled.clone();
        let app = verdict_receiver::axum::router(receiver, move |event: Event| {
            let sink = sink.clone();
            async move {
                sink.lock().unwrap().push(event.envelope.event_id.clone());
                Ok::<_, std::convert::Infallible>(())
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Integrator {
            addr,
            handled,
            _task: task,
        }
    }

    /// Waits briefly for the handler (it runs after the 2xx) and returns what it saw.
    async fn handled(&self, expected: usize) -> Vec<String> {
        for _ in 0..50 {
            if self.handled.lock().unwrap().len() >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A little longer, to catch a second (wrong) run.
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.handled.lock().unwrap().clone()
    }
}

fn client(url: &str, tenant: &common::Tenant) -> Client {
    Client::builder(url, &tenant.api_key)
        .signing_secret(Secret::parse(&tenant.signing_secret).unwrap())
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap()
}

/// Runs one signal through with `client_faults` between client and server and
/// `callback_faults` between server and receiver, then lets the worker retry.
async fn one_signal_through(
    backend: Backend,
    client_faults: Vec<Fault>,
    callback_faults: Vec<Fault>,
) {
    let client_attempts = 1 + client_faults.len() as u32;
    let callback_attempts = 1 + callback_faults.len();
    let db = TestDb::new(backend).await;
    // The tenant is created first to learn its webhook secret, then pointed at the proxy.
    let tenant = db.tenant(&[]);
    let integrator = Integrator::start(&tenant.webhook_secret).await;
    let to_receiver = Proxy::start(integrator.addr.clone(), callback_faults).await;
    db.cli(&[
        "tenant",
        "set-callback",
        "--tenant",
        &tenant.id,
        "--url",
        &format!("{}/", to_receiver.url),
    ]);
    let server = Server::start(&db, &MANUAL_WORKER);
    let to_server = Proxy::start(
        server.base.trim_start_matches("http://").to_owned(),
        client_faults,
    )
    .await;

    let outcome = client(&to_server.url, &tenant)
        .send_signal(&serde_json::from_str(&sim_swap("+447700900601")).unwrap())
        .await
        .unwrap();
    assert_eq!(outcome.body["decision"], "deny");
    assert_eq!(
        outcome.attempts, client_attempts,
        "each client-side fault cost one attempt"
    );
    let event_id = outcome.body["event_id"].as_str().unwrap().to_owned();

    // Let the worker make its retries, if the callback needs any.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        db.worker_once(&[("VERDICT_RETRY_INTERVAL_SECS", "1")]);
    }

    assert_eq!(
        integrator.handled(1).await,
        vec![event_id.clone()],
        "handled exactly once"
    );
    assert_eq!(
        db.count("events").await,
        1,
        "the server holds exactly one event"
    );
    let event = server.event(&tenant, &event_id).await;
    assert_eq!(event["deliveries"][0]["status"], "succeeded", "{event}");
    let delivery_id = event["deliveries"][0]["id"].as_str().unwrap();
    let delivery = server
        .get(&tenant, &format!("/v1/deliveries/{delivery_id}"))
        .await
        .json();
    assert_eq!(
        delivery["attempts"].as_array().unwrap().len(),
        callback_attempts,
        "each callback-side fault cost one attempt: {delivery}"
    );
}

async fn the_clients_first_response_lost_still_yields_one_event_handled_once(b: Backend) {
    one_signal_through(b, vec![Fault::DropResponse], vec![]).await
}

async fn the_receiver_answering_503_once_still_yields_one_handling(b: Backend) {
    one_signal_through(b, vec![], vec![Fault::Answer503]).await
}

async fn the_receivers_2xx_lost_after_recording_still_yields_one_handling(b: Backend) {
    one_signal_through(b, vec![], vec![Fault::DropResponse]).await
}

async fn every_hop_failing_once_still_yields_one_event_handled_once(b: Backend) {
    one_signal_through(
        b,
        vec![Fault::Answer503, Fault::DropResponse],
        vec![Fault::DropResponse, Fault::Answer503],
    )
    .await
}

on_both_backends!(
    the_clients_first_response_lost_still_yields_one_event_handled_once,
    the_receiver_answering_503_once_still_yields_one_handling,
    the_receivers_2xx_lost_after_recording_still_yields_one_handling,
    every_hop_failing_once_still_yields_one_event_handled_once,
);
