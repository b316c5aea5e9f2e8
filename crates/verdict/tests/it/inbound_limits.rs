//! Bounds on what a client can hold open: header and body timeouts, the connection cap, and
//! which client request ids are kept. Driven over raw sockets against the real binary.

use std::time::{Duration, Instant};

use crate::common::{Backend, Reply, Server, TestDb, new_key, sim_swap};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

/// Opens a connection that sends half a request's headers and then nothing.
async fn stuck_in_headers(server: &Server) -> TcpStream {
    let mut stream = TcpStream::connect(addr(server)).await.unwrap();
    stream
        .write_all(b"POST /v1/signals HTTP/1.1\r\nHost: verdict\r\nContent-Type: appl")
        .await
        .unwrap();
    stream
}

/// Waits until the server closes `stream`, and returns how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(
            limit.saturating_sub(started.elapsed()),
            stream.read(&mut buf),
        )
        .await
        {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the connection was still open after {limit:?}"),
        }
    }
}

async fn clients_stuck_in_their_headers_neither_block_a_signal_nor_stay(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_HEADER_TIMEOUT_SECS", "2")]);
    let opened = Instant::now();
    let mut stuck = Vec::new();
    for _ in 0..200 {
        stuck.push(stuck_in_headers(&server).await);
    }
    let started = Instant::now();
    let reply = server
        .send(&tenant, Some(&new_key()), &sim_swap("+15551234567"))
        .await;
    assert_eq!(reply.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "a signal took {:?} beside 200 stuck clients",
        started.elapsed()
    );
    for stream in &mut stuck {
        closed_within(stream, Duration::from_secs(5)).await;
    }
    let all_closed = opened.elapsed();
    assert!(
        all_closed >= Duration::from_secs(2) && all_closed < Duration::from_secs(5),
        "stuck clients were cut off after {all_closed:?}, not the 2 s header timeout"
    );
}

async fn an_idle_connection_is_closed_after_the_header_timeout(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[("VERDICT_HEADER_TIMEOUT_SECS", "1")]);
    let mut silent = TcpStream::connect(addr(&server)).await.unwrap();
    let took = closed_within(&mut silent, Duration::from_secs(4)).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");

    // A kept-alive connection gets the same time for its next request's headers.
    let mut kept = TcpStream::connect(addr(&server)).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: verdict\r\n\r\n")
        .await
        .unwrap();
    let took = closed_within(&mut kept, Duration::from_secs(4)).await;
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
}

/// A connection from `source`, another loopback address: another client to the server.
async fn connect_from(server: &Server, source: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(addr(server).parse().unwrap()).await.unwrap()
}

/// Opens a connection from `source` whose request is under way: headers sent, its body not.
async fn stuck_in_body(server: &Server, source: &str) -> TcpStream {
    let mut stream = connect_from(server, source).await;
    stream
        .write_all(
            b"POST /v1/signals HTTP/1.1\r\nHost: verdict\r\nContent-Type: application/json\r\n\
              Authorization: Bearer vk_any\r\nIdempotency-Key: k\r\nContent-Length: 400\r\n\r\n\
              {\"type\":",
        )
        .await
        .unwrap();
    stream
}

/// The start of what the server sends on `stream` within `limit` (empty if nothing).
async fn first_answer(stream: &mut TcpStream, limit: Duration) -> String {
    let mut buf = vec![0u8; 1024];
    match tokio::time::timeout(limit, stream.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        _ => String::new(),
    }
}

/// A `GET /healthz` from this machine's usual address, and how long it took.
async fn healthz_took(server: &Server) -> Duration {
    let started = Instant::now();
    let reply = server
        .client
        .get(format!("{}/healthz", server.base))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("/healthz was not answered within 10 s");
    assert_eq!(reply.status(), 200);
    started.elapsed()
}

async fn connections_past_the_cap_wait_for_a_free_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(
        &db,
        &[
            ("VERDICT_MAX_CONNECTIONS", "4"),
            ("VERDICT_BODY_TIMEOUT_SECS", "2"),
        ],
    );
    // Four requests under way (idle connections would be shed; these are busy).
    let mut busy = Vec::new();
    for _ in 0..4 {
        busy.push(stuck_in_body(&server, "127.0.0.2").await);
    }
    // Let the server accept all four before the fifth arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waited = healthz_took(&server).await;
    assert!(
        waited >= Duration::from_millis(1500),
        "the fifth connection was served after {waited:?}, past a cap of four"
    );
}

async fn one_address_cannot_hold_every_connection(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(
        &db,
        &[
            ("VERDICT_MAX_CONNECTIONS", "64"),
            ("VERDICT_MAX_CONNECTIONS_PER_CLIENT", "16"),
        ],
    );
    // One client opens as many connections as the whole cap and sends nothing on them.
    let mut held = Vec::new();
    for _ in 0..64 {
        held.push(connect_from(&server, "127.0.0.2").await);
    }
    let mut refused = 0;
    for stream in &mut held {
        let answer = first_answer(stream, Duration::from_millis(300)).await;
        if answer.starts_with("HTTP/1.1 429") {
            assert!(answer.contains("too-many-connections"), "{answer}");
            refused += 1;
        }
    }
    assert_eq!(
        refused, 48,
        "past its 16, each of the client's connections is refused"
    );
    // Another client is served at once, not when the held ones time out.
    let took = healthz_took(&server).await;
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
}

async fn idle_connections_are_shed_when_the_cap_is_near(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(
        &db,
        &[
            ("VERDICT_MAX_CONNECTIONS", "32"),
            ("VERDICT_MAX_CONNECTIONS_PER_CLIENT", "8"),
        ],
    );
    // Four clients fill the cap with kept-alive connections, idle after one request each
    // (some may be shed already as the cap nears: that is the point).
    let mut idle = Vec::new();
    for client in 2..=5 {
        for _ in 0..8 {
            let mut stream = connect_from(&server, &format!("127.0.0.{client}")).await;
            let _ = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: verdict\r\n\r\n")
                .await;
            let _ = first_answer(&mut stream, Duration::from_millis(500)).await;
            idle.push(stream);
        }
    }
    // A fifth client is served within a moment: idle connections go first.
    let took = healthz_took(&server).await;
    assert!(took < Duration::from_secs(1), "/healthz took {took:?}");
    let mut shed = 0;
    for stream in &mut idle {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_millis(50), stream.read(&mut buf)).await;
        if matches!(read, Ok(Ok(0) | Err(_))) {
            shed += 1;
        }
    }
    assert!(shed > 0, "no idle connection was closed");
}

async fn a_body_sent_too_slowly_gets_408_and_claims_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &[("VERDICT_BODY_TIMEOUT_SECS", "1")]);
    let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
    let head = format!(
        "POST /v1/signals HTTP/1.1\r\nHost: verdict\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: {}\r\nContent-Length: 400\r\n\r\n{{\"type\":",
        tenant.api_key,
        new_key()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("https://verdict.dev/problems/request-timeout"),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(db.count("idempotency_keys").await, 0);
}

async fn a_body_trickled_a_byte_at_a_time_is_cut_at_the_body_timeout(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--no-inbound-signature"]);
    let server = Server::start(&db, &[("VERDICT_BODY_TIMEOUT_SECS", "1")]);
    let mut stream = TcpStream::connect(addr(&server)).await.unwrap();
    let head = format!(
        "POST /v1/signals HTTP/1.1\r\nHost: verdict\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nIdempotency-Key: {}\r\nContent-Length: 4000\r\n\r\n",
        tenant.api_key,
        new_key()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    // A byte every 200 ms: never a second's silence, which a per-byte timer would allow for
    // as long as the client liked.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(6) {
        if stream.write_all(b" ").await.is_err() {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if !answer.is_empty() {
            break;
        }
    }
    let took = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "after {took:?}: {answer}"
    );
    assert!(took < Duration::from_secs(3), "cut after {took:?}");
    assert_eq!(db.count("idempotency_keys").await, 0);
}

async fn only_short_safe_request_ids_are_kept(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[]);
    let id_of = |sent: String| {
        let server = &server;
        async move {
            let reply = Reply::from(
                server
                    .client
                    .get(format!("{}/healthz", server.base))
                    .header("x-request-id", sent)
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            reply.header("x-request-id").unwrap().to_owned()
        }
    };
    assert_eq!(id_of("req-42.abc:9_Z".into()).await, "req-42.abc:9_Z");
    for unsafe_id in [
        "has spaces".to_owned(),
        "x".repeat(65),
        "a\tb".to_owned(),
        "<script>".to_owned(),
        "id/../../etc".to_owned(),
        "quote\"d".to_owned(),
    ] {
        let got = id_of(unsafe_id.clone()).await;
        assert_ne!(got, unsafe_id);
        assert!(
            uuid::Uuid::parse_str(&got).is_ok(),
            "{got} is not a fresh id"
        );
    }
    assert!(!server.logs().contains("has spaces"));
}

on_both_backends!(
    clients_stuck_in_their_headers_neither_block_a_signal_nor_stay,
    an_idle_connection_is_closed_after_the_header_timeout,
    connections_past_the_cap_wait_for_a_free_one,
    one_address_cannot_hold_every_connection,
    idle_connections_are_shed_when_the_cap_is_near,
    a_body_sent_too_slowly_gets_408_and_claims_nothing,
    a_body_trickled_a_byte_at_a_time_is_cut_at_the_body_timeout,
    only_short_safe_request_ids_are_kept,
);
