//! Hostile input, table-driven against the real server: each row is one request, the 4xx and
//! problem type it must get, and the proof that it left nothing behind (no key claimed, no
//! event, no new playbook version); the server keeps answering afterwards.

mod common;

use common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};

/// A phone number a client may put where it does not belong; no answer may repeat it.
const PHONE: &str = "+447700900123";

/// What one row sends.
enum Send {
    /// A signal body, signed, with a fresh key.
    Signal(String),
    /// A playbook document, `PUT` as TOML.
    Playbook(String),
    /// A signal with raw extra headers replacing the signature ones.
    SignalWithHeaders(String, Vec<(&'static str, String)>),
}

struct Row {
    what: &'static str,
    send: Send,
    status: u16,
    problem: &'static str,
}

fn signal_with(field: &str, value: &str) -> String {
    let mut body: serde_json::Value = serde_json::from_str(&sim_swap("+15551234567")).unwrap();
    body[field] = serde_json::from_str(value).unwrap();
    body.to_string()
}

fn rule(name: &str, when: &str) -> String {
    format!("[[rule]]\nname = \"{name}\"\ndecision = \"deny\"\nwhen = {{ {when} }}\n")
}

fn rows() -> Vec<Row> {
    let sim = sim_swap("+15551234567");
    vec![
        Row {
            what: "a 100,000-character rule name",
            send: Send::Playbook(rule(&"n".repeat(100_000), "")),
            status: 413,
            problem: "payload-too-large",
        },
        Row {
            what: "a 65-character rule name",
            send: Send::Playbook(rule(&"n".repeat(65), "")),
            status: 422,
            problem: "playbook-limit-exceeded",
        },
        Row {
            what: "5,000 rules",
            send: Send::Playbook((0..5000).map(|i| rule(&format!("r{i}"), "")).collect()),
            status: 413,
            problem: "payload-too-large",
        },
        Row {
            what: "101 rules",
            send: Send::Playbook((0..101).map(|i| rule(&format!("r{i}"), "")).collect()),
            status: 422,
            problem: "playbook-limit-exceeded",
        },
        Row {
            what: "observed_within_hours = 1e16",
            send: Send::Playbook(rule("a", "observed_within_hours = 1e16")),
            status: 422,
            problem: "playbook-limit-exceeded",
        },
        Row {
            what: "a window of NaN hours",
            send: Send::Playbook(rule("a", "observed_within_hours = nan")),
            status: 400,
            problem: "invalid-playbook",
        },
        Row {
            what: "observed_at in year 9999",
            send: Send::Signal(signal_with("observed_at", "\"9999-12-31T23:59:59Z\"")),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "duplicate member names",
            send: Send::Signal(sim.replacen('{', r#"{"type":"port_out","#, 1)),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "a phone number as the type",
            send: Send::Signal(signal_with("type", &format!("\"{PHONE}\""))),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "a phone number as observed_at",
            send: Send::Signal(signal_with("observed_at", &format!("\"{PHONE}\""))),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "a phone number as an unknown field's name",
            send: Send::Signal(signal_with(PHONE, "1")),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "a phone number that is not E.164",
            send: Send::Signal(sim_swap("447700900123")),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "a body over 64 KiB",
            send: Send::Signal(signal_with(
                "metadata",
                &format!("{{\"pad\":\"{}\"}}", "x".repeat(70_000)),
            )),
            status: 413,
            problem: "payload-too-large",
        },
        Row {
            what: "nesting deeper than the parser allows",
            send: Send::Signal(signal_with(
                "metadata",
                &format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100)),
            ))
            .deepen(),
            status: 400,
            problem: "invalid-request",
        },
        Row {
            what: "an empty signature header",
            send: Send::SignalWithHeaders(
                sim.clone(),
                vec![
                    ("verdict-timestamp", now().to_string()),
                    ("verdict-signature", String::new()),
                ],
            ),
            status: 401,
            problem: "invalid-signature",
        },
        Row {
            what: "a signature list of 1,000 entries",
            send: Send::SignalWithHeaders(
                sim.clone(),
                vec![
                    ("verdict-timestamp", now().to_string()),
                    ("verdict-signature", vec!["v1,AAAA"; 1000].join(" ")),
                ],
            ),
            status: 401,
            problem: "invalid-signature",
        },
        Row {
            what: "a timestamp in year 9999",
            send: Send::SignalWithHeaders(
                sim,
                vec![
                    ("verdict-timestamp", "253402300799".into()),
                    ("verdict-signature", "v1,AAAA".into()),
                ],
            ),
            status: 401,
            problem: "stale-timestamp",
        },
    ]
}

impl Send {
    /// Nests the metadata's array past serde_json's recursion limit of 128.
    fn deepen(self) -> Self {
        match self {
            Send::Signal(body) => Send::Signal(
                body.replace("[".repeat(100).as_str(), "[".repeat(200).as_str())
                    .replace("]".repeat(100).as_str(), "]".repeat(200).as_str()),
            ),
            other => other,
        }
    }
}

async fn request(server: &Server, tenant: &Tenant, send: &Send) -> Reply {
    let signals = server.client.post(format!("{}/v1/signals", server.base));
    let req = match send {
        Send::Signal(body) => signed(signals, tenant, Some(&new_key()), body, now()),
        Send::SignalWithHeaders(body, headers) => {
            let mut req = signals
                .bearer_auth(&tenant.api_key)
                .header("content-type", "application/json")
                .header("idempotency-key", new_key())
                .body(body.clone());
            for (name, value) in headers {
                req = req.header(*name, value);
            }
            req
        }
        Send::Playbook(source) => server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(source.clone()),
    };
    Reply::from(req.send().await.unwrap()).await
}

async fn hostile_requests_get_a_4xx_problem_and_leave_nothing_behind(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    for row in rows() {
        let reply = request(&server, &tenant, &row.send).await;
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(reply.status, row.status, "{}: {body}", row.what);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json"),
            "{}",
            row.what
        );
        assert_eq!(
            reply.json()["type"],
            format!("https://verdict.dev/problems/{}", row.problem),
            "{}",
            row.what
        );
        assert!(
            !body.contains("447700900123"),
            "{} echoes the value: {body}",
            row.what
        );
        assert!(
            body.len() < 2048,
            "{}: a {} byte answer",
            row.what,
            body.len()
        );
        assert_eq!(
            db.count("idempotency_keys").await,
            0,
            "{} claimed a key",
            row.what
        );
        assert_eq!(db.count("events").await, 0, "{} stored an event", row.what);
        assert_eq!(
            db.count("playbooks").await,
            0,
            "{} stored a playbook",
            row.what
        );
    }
    // Nothing above hurt the server: a good signal is decided as usual.
    let ok = server
        .send(&tenant, Some(&new_key()), &sim_swap(PHONE))
        .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    assert_eq!(ok.json()["decision"], "deny");
    assert!(
        !server.logs().contains("447700900123"),
        "a raw phone number reached the logs"
    );
}

on_both_backends!(hostile_requests_get_a_4xx_problem_and_leave_nothing_behind);
