//! Hostile input, table-driven against the real server: each row is one request, the 4xx and
//! problem type it must get, and the proof that it left nothing behind (no key claimed, no
//! event, no new playbook version); the server keeps answering afterwards.

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};

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

/// Whose key a row's request carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    /// The tenant's admin key.
    Admin,
    /// A key with the `read` scope.
    Reader,
    /// A key with the `ingest` scope.
    Ingester,
    /// An `ingest` key revoked before the server started.
    Revoked,
    /// The admin key of a tenant limited to 1 request a second, its burst just spent.
    Limited,
}

struct Row {
    what: &'static str,
    who: Who,
    send: Send,
    status: u16,
    problem: &'static str,
}

impl Row {
    fn new(what: &'static str, send: Send, status: u16, problem: &'static str) -> Self {
        Row {
            what,
            who: Who::Admin,
            send,
            status,
            problem,
        }
    }

    fn by(mut self, who: Who) -> Self {
        self.who = who;
        self
    }
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
        Row::new(
            "a 100,000-character rule name",
            Send::Playbook(rule(&"n".repeat(100_000), "")),
            413,
            "payload-too-large",
        ),
        Row::new(
            "a 65-character rule name",
            Send::Playbook(rule(&"n".repeat(65), "")),
            422,
            "playbook-limit-exceeded",
        ),
        Row::new(
            "5,000 rules",
            Send::Playbook((0..5000).map(|i| rule(&format!("r{i}"), "")).collect()),
            413,
            "payload-too-large",
        ),
        Row::new(
            "101 rules",
            Send::Playbook((0..101).map(|i| rule(&format!("r{i}"), "")).collect()),
            422,
            "playbook-limit-exceeded",
        ),
        Row::new(
            "observed_within_hours = 1e16",
            Send::Playbook(rule("a", "observed_within_hours = 1e16")),
            422,
            "playbook-limit-exceeded",
        ),
        Row::new(
            "a window of NaN hours",
            Send::Playbook(rule("a", "observed_within_hours = nan")),
            400,
            "invalid-playbook",
        ),
        Row::new(
            "observed_at in year 9999",
            Send::Signal(signal_with("observed_at", "\"9999-12-31T23:59:59Z\"")),
            400,
            "invalid-request",
        ),
        Row::new(
            "duplicate member names",
            Send::Signal(sim.replacen('{', r#"{"type":"port_out","#, 1)),
            400,
            "invalid-request",
        ),
        Row::new(
            "a phone number as the type",
            Send::Signal(signal_with("type", &format!("\"{PHONE}\""))),
            400,
            "invalid-request",
        ),
        Row::new(
            "a phone number as observed_at",
            Send::Signal(signal_with("observed_at", &format!("\"{PHONE}\""))),
            400,
            "invalid-request",
        ),
        Row::new(
            "a phone number as an unknown field's name",
            Send::Signal(signal_with(PHONE, "1")),
            400,
            "invalid-request",
        ),
        Row::new(
            "a phone number that is not E.164",
            Send::Signal(sim_swap("447700900123")),
            400,
            "invalid-request",
        ),
        Row::new(
            "a body over 64 KiB",
            Send::Signal(signal_with(
                "metadata",
                &format!("{{\"pad\":\"{}\"}}", "x".repeat(70_000)),
            )),
            413,
            "payload-too-large",
        ),
        Row::new(
            "nesting deeper than the parser allows",
            Send::Signal(signal_with(
                "metadata",
                &format!("{{\"a\":{}1{}}}", "[".repeat(100), "]".repeat(100)),
            ))
            .deepen(),
            400,
            "invalid-request",
        ),
        Row::new(
            "an empty signature header",
            Send::SignalWithHeaders(
                sim.clone(),
                vec![
                    ("verdict-timestamp", now().to_string()),
                    ("verdict-signature", String::new()),
                ],
            ),
            401,
            "invalid-signature",
        ),
        Row::new(
            "a signature list of 1,000 entries",
            Send::SignalWithHeaders(
                sim.clone(),
                vec![
                    ("verdict-timestamp", now().to_string()),
                    ("verdict-signature", ["v1,AAAA"; 1000].join(" ")),
                ],
            ),
            401,
            "invalid-signature",
        ),
        Row::new(
            "a timestamp in year 9999",
            Send::SignalWithHeaders(
                sim,
                vec![
                    ("verdict-timestamp", "253402300799".into()),
                    ("verdict-signature", "v1,AAAA".into()),
                ],
            ),
            401,
            "stale-timestamp",
        ),
        Row::new(
            "a signal from a read key",
            Send::Signal(sim_swap(PHONE)),
            403,
            "insufficient-scope",
        )
        .by(Who::Reader),
        Row::new(
            "a playbook from an ingest key (allow everything, no actions)",
            Send::Playbook("[[rule]]\nname = \"off\"\ndecision = \"allow\"\nactions = []\n".into()),
            403,
            "insufficient-scope",
        )
        .by(Who::Ingester),
        Row::new(
            "a signal from a revoked key",
            Send::Signal(sim_swap(PHONE)),
            401,
            "invalid-api-key",
        )
        .by(Who::Revoked),
        Row::new(
            "a signal over the tenant's rate limit",
            Send::Signal(sim_swap(PHONE)),
            429,
            "rate-limited",
        )
        .by(Who::Limited),
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
    let (_, reader) = db.issue_key(&tenant, "read");
    let (_, ingester) = db.issue_key(&tenant, "ingest");
    let (revoked_id, revoked) = db.issue_key(&tenant, "ingest");
    db.cli(&[
        "tenant",
        "key",
        "revoke",
        "--tenant",
        &tenant.id,
        "--key-id",
        &revoked_id,
    ]);
    let limited = db.tenant(&[]);
    db.cli(&[
        "tenant",
        "set-rate-limit",
        "--tenant",
        &limited.id,
        "--per-second",
        "1",
    ]);
    let server = Server::start(&db, &[]);
    for row in rows() {
        let caller = match row.who {
            Who::Admin => &tenant,
            Who::Reader => &reader,
            Who::Ingester => &ingester,
            Who::Revoked => &revoked,
            Who::Limited => {
                // Spend the burst on a request that writes nothing.
                let read = server
                    .client
                    .get(format!("{}/v1/events", server.base))
                    .bearer_auth(&limited.api_key)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(read.status(), 200);
                &limited
            }
        };
        let reply = request(&server, caller, &row.send).await;
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
