//! `verdict listen`: prints each verified, deduplicated callback once, and nothing for a
//! duplicate or a refused request, across a restart with a SQLite dedup store.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use verdict_webhooks::{Secret, signed_headers};

struct Listener {
    child: Child,
    lines: mpsc::Receiver<String>,
    url: String,
}

impl Listener {
    fn start(secret: &str, db: &str) -> Listener {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_verdict"))
            .args(["listen", "--secret", secret, "--db", db])
            // Its address from the environment, as `serve` takes VERDICT_LISTEN.
            .env("VERDICT_RECEIVER_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = ready_tx.send(());
                }
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("listen did not start");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Listener {
            child,
            lines,
            url: format!("http://127.0.0.1:{port}/"),
        }
    }

    /// Lines printed within a short wait.
    fn printed(&self) -> Vec<String> {
        std::thread::sleep(Duration::from_millis(300));
        self.lines.try_iter().collect()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn envelope(event_id: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "event_id": event_id, "tenant": "t1", "event_type": "decision.sim_swap",
        "subject_hash": "ab".repeat(32),
        // The dedup tuple includes the timestamp: each event gets its own.
        "timestamp": format!("2026-11-30T10:00:00.{:0>3}Z", event_id.trim_start_matches("evt-")),
        "decision": "deny", "actions": [], "metadata": {"ticket": "T-1"},
    }))
    .unwrap()
}

async fn post(url: &str, secret: &Secret, id: &str, ts: i64, body: &[u8]) -> u16 {
    post_other_bytes(url, secret, id, ts, body, body).await
}

/// Signs `signed` but sends `sent`.
async fn post_other_bytes(
    url: &str,
    secret: &Secret,
    id: &str,
    ts: i64,
    signed: &[u8],
    sent: &[u8],
) -> u16 {
    let mut req = reqwest::Client::new().post(url).body(sent.to_vec());
    for (name, value) in signed_headers(std::slice::from_ref(secret), id, ts, signed) {
        req = req.header(name, value);
    }
    req.send().await.unwrap().status().as_u16()
}

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[tokio::test]
async fn listen_prints_each_callback_once_and_nothing_for_duplicates_or_refusals() {
    let dir = std::env::temp_dir().join(format!("verdict-listen-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite://{}", dir.join("received.db").display());
    let secret = Secret::generate();
    let listener = Listener::start(&secret.to_whsec(), &db);
    let body = envelope("evt-1");

    assert_eq!(
        post(&listener.url, &secret, "msg_1", now(), &body).await,
        204
    );
    let printed = listener.printed();
    assert_eq!(printed.len(), 1);
    assert_eq!(
        printed[0].as_bytes(),
        &body[..],
        "the callback, as one JSON line"
    );

    assert!(
        post(&listener.url, &secret, "msg_1", now(), &body).await < 300,
        "a duplicate is 2xx"
    );
    let fresh = envelope("evt-2");
    let mut tampered = fresh.clone();
    tampered[10] ^= 1;
    assert_eq!(
        post_other_bytes(&listener.url, &secret, "msg_2", now(), &fresh, &tampered).await,
        401
    );
    let other = Secret::generate();
    assert_eq!(
        post(&listener.url, &other, "msg_3", now(), &envelope("evt-3")).await,
        401
    );
    assert_eq!(
        post(
            &listener.url,
            &secret,
            "msg_4",
            now() - 301,
            &envelope("evt-4")
        )
        .await,
        401
    );
    assert!(
        listener.printed().is_empty(),
        "nothing for a duplicate or a refused request"
    );
    drop(listener);

    // Restarted on the same SQLite store, it still discards a redelivery of the first event.
    let listener = Listener::start(&secret.to_whsec(), &db);
    assert!(post(&listener.url, &secret, "msg_1", now(), &body).await < 300);
    assert!(listener.printed().is_empty());
    assert_eq!(
        post(&listener.url, &secret, "msg_5", now(), &envelope("evt-5")).await,
        204
    );
    assert_eq!(listener.printed().len(), 1);
    drop(listener);
    std::fs::remove_dir_all(&dir).ok();
}
