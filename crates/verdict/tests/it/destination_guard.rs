//! The destination guard on the real binary: every spelling of an internal address is refused
//! when a callback URL is set, and one stored anyway never reaches a port on this machine at
//! delivery time; link-local addresses need their own setting on top of private ones.

use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::deliveries::delivery_of;
use crate::common::{Backend, Server, Tenant, TestDb, new_key, sim_swap};

/// Listeners on 127.0.0.1 and (where this machine has it) ::1, on one port, counting every
/// connection they accept.
struct Listeners {
    port: u16,
    accepted: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Listeners {
    async fn start() -> Listeners {
        let v4 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = v4.local_addr().unwrap().port();
        let mut listeners = vec![v4];
        if let Ok(v6) = tokio::net::TcpListener::bind(("::1", port)).await {
            listeners.push(v6);
        }
        let accepted = Arc::new(AtomicUsize::new(0));
        let tasks = listeners
            .into_iter()
            .map(|listener| {
                let accepted = accepted.clone();
                tokio::spawn(async move {
                    while let Ok((socket, _)) = listener.accept().await {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        drop(socket);
                    }
                })
            })
            .collect();
        Listeners {
            port,
            accepted,
            tasks,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Every spelling of an address on this machine (or a metadata endpoint) that the guard must
/// refuse, with the text its refusal must contain. WHATWG URL parsing, which reqwest uses, reads
/// `127.1`, `0x7f000001`, `2130706433` and `017700000001` as 127.0.0.1.
fn spellings(port: u16) -> Vec<(String, &'static str)> {
    let mut all: Vec<(String, &'static str)> = [
        (
            "http://127.0.0.1:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://127.1:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://0x7f000001:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://2130706433:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://017700000001:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://0177.0.0.1:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://127.0.0.1.:{port}/hook",
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://[::ffff:127.0.0.1]:{port}/hook",
            "is an IPv4-mapped address embedding 127.0.0.1, a loopback address",
        ),
        ("http://[::1]:{port}/hook", "::1 is a loopback address"),
        (
            "http://0.0.0.0:{port}/hook",
            "0.0.0.0 is an unspecified address",
        ),
        (
            "http://localhost:{port}/hook",
            "localhost is a loopback name",
        ),
        (
            "http://LOCALHOST.:{port}/hook",
            "localhost is a loopback name",
        ),
        (
            "http://api.localhost:{port}/hook",
            "api.localhost is a loopback name",
        ),
        (
            "http://169.254.169.254/latest/meta-data",
            "169.254.169.254 is a link-local (cloud metadata) address",
        ),
        (
            "http://[fe80::1]:{port}/hook",
            "fe80::1 is a link-local address",
        ),
        (
            "http://[64:ff9b::7f00:1]:{port}/hook",
            "64:ff9b::7f00:1 is a NAT64 address embedding 127.0.0.1, a loopback address",
        ),
        (
            "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
            "embedding 169.254.169.254, a link-local (cloud metadata) address",
        ),
        (
            "http://[::127.0.0.1]:{port}/hook",
            "is an IPv4-compatible address (deprecated) embedding 127.0.0.1",
        ),
        (
            "http://[2002:7f00:1::]:{port}/hook",
            "2002:7f00:1:: is a 6to4 address embedding 127.0.0.1, a loopback address",
        ),
        (
            "http://10.0.0.1:{port}/hook",
            "10.0.0.1 is a private (RFC 1918) address",
        ),
        (
            "http://100.64.0.1/hook",
            "100.64.0.1 is a shared (carrier-grade NAT) address",
        ),
        (
            "http://[fd00::1]/hook",
            "fd00::1 is a unique local (private) address",
        ),
        (
            "http://192.0.0.1/hook",
            "192.0.0.1 is an IETF protocol assignment",
        ),
        ("http://[2001::1]/hook", "2001::1 is a Teredo address"),
    ]
    .into_iter()
    .map(|(url, why)| (url.replace("{port}", &port.to_string()), why))
    .collect();
    // A name that is not `localhost` but resolves to loopback (this machine's own name, on
    // most systems) reaches the resolver's check at connect time.
    if let Some(name) = loopback_hostname() {
        all.push((format!("http://{name}:{port}/hook"), RESOLVED));
    }
    all
}

/// What a name refused by the resolver is refused as (`vm (127.0.0.1) is …`).
const RESOLVED: &str = "(127.0.0.1) is a loopback address";

/// This machine's host name, if it resolves to loopback addresses only.
fn loopback_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_owned();
    let addrs: Vec<_> = (name.as_str(), 80).to_socket_addrs().ok()?.collect();
    (!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())).then_some(name)
}

/// `tenant set-callback` with private destinations off (the default).
fn set_callback(db: &TestDb, tenant: &Tenant, url: &str, env: &[(&str, &str)]) -> (bool, String) {
    let out = db.cli_output(
        &[
            "tenant",
            "set-callback",
            "--tenant",
            &tenant.id,
            "--url",
            url,
        ],
        env,
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const STRICT: [(&str, &str); 1] = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "0")];

async fn every_spelling_of_an_internal_address_is_refused_when_set_and_unreachable_when_stored(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let local = Listeners::start().await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_NO_WORKER", "1")]);

    for (n, (url, why)) in spellings(local.port).into_iter().enumerate() {
        // Refused when set, saying why; nothing is stored.
        if why != RESOLVED {
            let (ok, stderr) = set_callback(&db, &tenant, &url, &STRICT);
            assert!(!ok, "{url} was accepted");
            assert!(
                stderr.contains("the callback URL is refused: "),
                "{url}: {stderr}"
            );
            assert!(stderr.contains(why), "{url}: {stderr}");
            assert_eq!(
                db.scalar("SELECT COUNT(*) FROM endpoints").await,
                0,
                "{url}"
            );
        }

        // Stored anyway (an older version, another policy): refused at delivery time, terminal.
        db.exec(format!(
            "INSERT INTO endpoints (id, tenant_id, name, url, created_at, updated_at) \
             SELECT id, id, 'default', '{url}', 0, 0 FROM tenants"
        ))
        .await;
        let reply = server
            .send(
                &tenant,
                Some(&new_key()),
                &sim_swap(&format!("+4477009006{n:02}")),
            )
            .await;
        assert_eq!(reply.status, 200, "{url}");
        let d = delivery_of(&server, &tenant, &reply).await;
        assert_eq!(d["status"], "failed", "{url}: {d}");
        let error = d["attempts"][0]["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("destination refused: "), "{url}: {d}");
        assert!(error.contains(why), "{url}: {error}");
        assert_eq!(d["attempts"].as_array().unwrap().len(), 1, "{url}: {d}");
        db.exec("DELETE FROM endpoints").await;
    }
    assert_eq!(
        local.accepted(),
        0,
        "a refused destination reached a local port"
    );

    // `tenant create --callback-url` is guarded the same way, and creates nothing.
    let out = db.cli_output(
        &[
            "tenant",
            "create",
            "--name",
            "probe",
            "--json",
            "--callback-url",
            "http://169.254.169.254/latest/meta-data",
        ],
        &STRICT,
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("169.254.169.254 is a link-local (cloud metadata) address"),
        "{stderr}"
    );
    assert_eq!(db.count("tenants").await, 1);
}

async fn allowing_private_destinations_still_refuses_link_local_ones(backend: Backend) {
    let db = TestDb::new(backend).await;
    let local = Listeners::start().await;
    let tenant = db.tenant(&[]);
    let allow_private = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")];
    let allow_both = [
        ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
        ("VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS", "1"),
    ];
    // A link-local address with nothing behind it: an allowed attempt fails on the network.
    let link_local = "http://169.254.0.9:9/hook";

    let loopback = format!("http://127.0.0.1:{}/hook", local.port);
    assert!(set_callback(&db, &tenant, &loopback, &allow_private).0);
    for url in [
        link_local,
        "http://169.254.169.254/latest",
        "http://[fe80::1]/",
    ] {
        let (ok, stderr) = set_callback(&db, &tenant, url, &allow_private);
        assert!(!ok, "{url}");
        assert!(
            stderr.contains("VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS=1 allows them"),
            "{stderr}"
        );
    }
    // Reserved ranges stay refused whatever is allowed.
    for url in [
        "http://0.0.0.0/",
        "http://[64:ff9b::7f00:1]/",
        "http://224.0.0.1/",
    ] {
        assert!(!set_callback(&db, &tenant, url, &allow_both).0, "{url}");
    }
    let (ok, stderr) = set_callback(&db, &tenant, link_local, &allow_both);
    assert!(ok, "{stderr}");

    // At delivery time: private allowed, link-local refused.
    let mut env = allow_private.to_vec();
    env.extend([
        ("VERDICT_NO_WORKER", "1"),
        ("VERDICT_INLINE_DEADLINE_MS", "500"),
    ]);
    let server = Server::start(&db, &env);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900701"))
        .await;
    let d = delivery_of(&server, &tenant, &reply).await;
    assert_eq!(d["status"], "failed", "{d}");
    assert!(
        d["last_error"]
            .as_str()
            .unwrap()
            .contains("destination refused: 169.254.0.9 is a link-local (cloud metadata) address"),
        "{d}"
    );
    drop(server);

    // With link-local allowed too, the guard lets the attempt out: whatever the network makes
    // of it (nothing listens there; a sandbox's egress filter may answer), it is not refused.
    env.push(("VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS", "1"));
    let server = Server::start(&db, &env);
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900702"))
        .await;
    let mut d = serde_json::Value::Null;
    for _ in 0..50 {
        d = delivery_of(&server, &tenant, &reply).await;
        if !d["attempts"].as_array().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let error = d["attempts"][0]["error"].as_str().unwrap_or_default();
    assert!(!error.is_empty(), "{d}");
    assert!(!error.contains("destination refused"), "{d}");
    assert_eq!(local.accepted(), 0);
}

on_both_backends!(
    every_spelling_of_an_internal_address_is_refused_when_set_and_unreachable_when_stored,
    allowing_private_destinations_still_refuses_link_local_ones,
);
