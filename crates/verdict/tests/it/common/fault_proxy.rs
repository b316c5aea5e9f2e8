//! A TCP fault proxy between `verdict` and a PostgreSQL cluster of the test's own, on
//! 127.0.0.1, whose mode the test switches while load runs: forward faithfully, go silent
//! (blackhole), add latency each way (slow), or cut a connection between a commit reaching
//! the server and its answer reaching the client (ambiguous commits).
//!
//! It reads the PostgreSQL wire protocol only as far as it must to time the cuts: message
//! framing in both directions, the client's `Parse`/`Bind` of the statement that commits a
//! batch alone, its `COMMIT`s, and the server's `ReadyForQuery`s. The URL it hands out disables
//! TLS so those bytes can be read.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the proxy does with the bytes of every connection, from the moment it is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Pass everything on at once.
    Forward,
    /// Stop reading and forwarding in both directions, keeping every socket open (no RST, no
    /// FIN): what the client sees of a network partition. Bytes read before are held, and
    /// everything flows again, in order, when the mode changes.
    Blackhole,
    /// Delay every chunk by a random time in `min_ms..=max_ms`, each way, keeping order.
    Slow { min_ms: u64, max_ms: u64 },
    /// Cut one in `one_in` commits (a batch's statement committed alone, or a `COMMIT`): the
    /// proxy forwards it, waits for the server to finish it (its `ReadyForQuery`), discards
    /// that answer and closes both sides. The client cannot tell whether it committed.
    CutCommits { one_in: usize },
}

/// What the proxy did.
#[derive(Default)]
pub struct Counts {
    pub connections: AtomicUsize,
    /// Commits cut after the server finished them and before the client heard.
    pub cuts: AtomicUsize,
    /// Of those, how many the server answered with an error (so nothing was committed).
    pub cuts_refused: AtomicUsize,
}

impl Counts {
    pub fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }
}

/// A running proxy; it stops accepting when dropped (connections already open go on until
/// either side closes them).
pub struct FaultProxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    pub counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

/// What identifies the statement that commits a batch on its own (`APPLY_ALONE`, in
/// `store/postgres_pipeline/`): only it calls this function.
const COMMITS_ALONE: &[u8] = b"verdict_require_settled";

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`127.0.0.1:PORT`).
    pub async fn start(upstream: String) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, watching) = watch::channel(Mode::Forward);
        let counts = Arc::new(Counts::default());
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(relay(client, server, watching.clone(), shared.clone()));
            }
        });
        FaultProxy {
            port,
            mode,
            counts,
            task,
        }
    }

    /// Switches every connection, open or to come, to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// `postgres://postgres@127.0.0.1:PORT/DATABASE` through the proxy, without TLS.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{database}?sslmode=disable",
            self.port
        )
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One connection's state shared by its two directions.
#[derive(Default)]
struct Conn {
    /// `ReadyForQuery`s the client has asked for so far (one per `Sync` or simple query, and
    /// one for the startup), and the one that ends a commit to cut, if any.
    asked: u64,
    cut_at: Option<u64>,
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    mode: watch::Receiver<Mode>,
    counts: Arc<Counts>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let conn = Arc::new(Mutex::new(Conn::default()));
    let (closing, closed) = watch::channel(false);
    let up = tokio::spawn(client_to_server(
        client_read,
        server_write,
        mode.clone(),
        conn.clone(),
        closed,
    ));
    server_to_client(server_read, client_write, mode, conn, counts, closing).await;
    up.abort();
}

/// Waits while the proxy is a blackhole; returns the mode it forwards in.
async fn forwarding(mode: &mut watch::Receiver<Mode>) -> Mode {
    loop {
        let now = *mode.borrow_and_update();
        if now != Mode::Blackhole {
            return now;
        }
        if mode.changed().await.is_err() {
            return Mode::Forward;
        }
    }
}

/// A random number in `lo..=hi`.
fn random_between(lo: u64, hi: u64) -> u64 {
    super::random_between(lo, hi)
}

/// Writes chunks to `to` in order, each no sooner than the time it carries: a delay line, so
/// each chunk is delayed on its own and a slow chunk never speeds up the next.
async fn delay_line(
    mut to: OwnedWriteHalf,
    mut chunks: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
) {
    while let Some((due, bytes)) = chunks.recv().await {
        tokio::time::sleep_until(due).await;
        if to.write_all(&bytes).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

/// When a chunk read now may be written in `mode`: a slow mode's delay, never before the
/// chunk ahead of it.
fn due(mode: Mode, last: &mut Instant) -> Instant {
    let delay = match mode {
        Mode::Slow { min_ms, max_ms } => Duration::from_millis(random_between(min_ms, max_ms)),
        _ => Duration::ZERO,
    };
    *last = (*last).max(Instant::now() + delay);
    *last
}

async fn client_to_server(
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    conn: Arc<Mutex<Conn>>,
    mut closed: watch::Receiver<bool>,
) {
    let (line, chunks) = mpsc::unbounded_channel();
    let writer = tokio::spawn(delay_line(to, chunks));
    let mut frames = Frames::startup();
    let mut commits_alone = HashSet::new();
    let mut cut_next_sync = false;
    let mut last = Instant::now();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let now = forwarding(&mut mode).await;
        let n = tokio::select! {
            read = from.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = mode.changed() => continue,
            _ = closed.changed() => break,
        };
        // What the client sent is read to its end before it is passed on, so a commit to cut
        // is marked before the server can answer it.
        for message in frames.push(&chunk[..n]) {
            let mut c = conn.lock().unwrap();
            match message.kind {
                Some(b'P') => {
                    let (name, sql) = two_strings(&message.body);
                    if contains(sql, COMMITS_ALONE) {
                        commits_alone.insert(name.to_vec());
                    } else {
                        commits_alone.remove(name);
                    }
                }
                Some(b'B') => {
                    let (_portal, statement) = two_strings(&message.body);
                    if commits_alone.contains(statement) && cut_this_one(now) {
                        cut_next_sync = true;
                    }
                }
                Some(b'S') => {
                    c.asked += 1;
                    if std::mem::take(&mut cut_next_sync) {
                        c.cut_at = Some(c.asked);
                    }
                }
                Some(b'Q') => {
                    c.asked += 1;
                    let sql = message.body.strip_suffix(b"\0").unwrap_or(&message.body);
                    if sql.eq_ignore_ascii_case(b"COMMIT") && cut_this_one(now) {
                        c.cut_at = Some(c.asked);
                    }
                }
                // The startup message: the server answers it with one ReadyForQuery.
                None => c.asked += 1,
                _ => {}
            }
        }
        if line
            .send((due(now, &mut last), chunk[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(line);
    let _ = writer.await;
}

/// Whether the commit just seen is one to cut (one in `one_in`, at random).
fn cut_this_one(mode: Mode) -> bool {
    match mode {
        Mode::CutCommits { one_in } => random_between(1, one_in as u64) == 1,
        _ => false,
    }
}

async fn server_to_client(
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
    conn: Arc<Mutex<Conn>>,
    counts: Arc<Counts>,
    closing: watch::Sender<bool>,
) {
    let (line, chunks) = mpsc::unbounded_channel();
    let writer = tokio::spawn(delay_line(to, chunks));
    let mut frames = Frames::typed();
    let mut answered = 0u64;
    let mut refused = false;
    let mut last = Instant::now();
    let mut chunk = vec![0u8; 64 * 1024];
    'relay: loop {
        let now = forwarding(&mut mode).await;
        let n = tokio::select! {
            read = from.read(&mut chunk) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            _ = mode.changed() => continue,
        };
        let mut out = Vec::with_capacity(n);
        for message in frames.push(&chunk[..n]) {
            let cut_at = conn.lock().unwrap().cut_at;
            let is_ready = message.kind == Some(b'Z');
            // The answer to a commit being cut never reaches the client; once the server has
            // finished the commit (its ReadyForQuery), both sides are closed.
            if let Some(at) = cut_at.filter(|&at| answered + 1 >= at) {
                refused |= message.kind == Some(b'E');
                answered += u64::from(is_ready);
                if answered >= at {
                    counts.cuts.fetch_add(1, Ordering::Relaxed);
                    if refused {
                        counts.cuts_refused.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = line.send((due(now, &mut last), out));
                    break 'relay;
                }
                continue;
            }
            answered += u64::from(is_ready);
            out.extend_from_slice(&message.raw);
        }
        if !out.is_empty() && line.send((due(now, &mut last), out)).is_err() {
            break;
        }
    }
    // The client sees its connection close (FIN) once what came before the cut is written.
    drop(line);
    let _ = writer.await;
    let _ = closing.send(true);
}

/// One wire-protocol message: its type byte (`None` for the untyped startup message) and
/// body, and its raw bytes.
struct Message {
    kind: Option<u8>,
    body: Vec<u8>,
    raw: Vec<u8>,
}

/// Splits a byte stream into whole messages.
struct Frames {
    buf: Vec<u8>,
    /// Whether the next message is the untyped startup message (the client's first, and again
    /// after an `SSLRequest` the server declined).
    startup: bool,
}

/// The startup message's code for an `SSLRequest` (the one untyped message answered with a
/// single byte instead of messages).
const SSL_REQUEST: u32 = 80_877_103;

impl Frames {
    fn startup() -> Frames {
        Frames {
            buf: Vec::new(),
            startup: true,
        }
    }

    fn typed() -> Frames {
        Frames {
            buf: Vec::new(),
            startup: false,
        }
    }

    /// Takes `bytes` in and returns the messages now complete.
    fn push(&mut self, bytes: &[u8]) -> Vec<Message> {
        self.buf.extend_from_slice(bytes);
        let mut messages = Vec::new();
        loop {
            let header = if self.startup { 4 } else { 5 };
            if self.buf.len() < header {
                break;
            }
            let at = header - 4;
            let length = u32::from_be_bytes(self.buf[at..at + 4].try_into().unwrap()) as usize;
            let total = at + length;
            if self.buf.len() < total {
                break;
            }
            let raw: Vec<u8> = self.buf.drain(..total).collect();
            let (kind, body) = if self.startup {
                let code = u32::from_be_bytes(raw[4..8].try_into().unwrap());
                // sslmode=disable sends none, but a declined one is followed by the startup.
                self.startup = code == SSL_REQUEST;
                (None, raw[8..].to_vec())
            } else {
                (Some(raw[0]), raw[5..].to_vec())
            };
            messages.push(Message { kind, body, raw });
        }
        messages
    }
}

/// The two NUL-terminated strings a `Parse` (name, SQL) or `Bind` (portal, statement) begins
/// with.
fn two_strings(body: &[u8]) -> (&[u8], &[u8]) {
    let first_end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    let rest = body.get(first_end + 1..).unwrap_or(&[]);
    let second_end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    (&body[..first_end], &rest[..second_end])
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
