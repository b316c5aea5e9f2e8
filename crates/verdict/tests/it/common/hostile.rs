//! Hostile callback receivers on 127.0.0.1, written on raw TCP so they can misbehave in ways
//! an HTTP server library will not: hang, reset, answer garbage, answer without end, redirect,
//! or trickle their answer a byte at a time. Each records when its connections arrived and how
//! many bytes it managed to write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a receiver misbehaves, after reading the whole request.
#[derive(Clone, Debug)]
pub enum Hostility {
    /// Never answers, and holds the connection open.
    Hang,
    /// Resets the connection (RST) without answering.
    Reset,
    /// Answers bytes that are not HTTP, then closes.
    Garbage,
    /// Answers 200 with a body of this many bytes, written as fast as the peer reads.
    HugeBody(u64),
    /// Answers 302 to this location.
    Redirect(String),
    /// Answers `200 OK` a byte at a time, this far apart: the status line never completes in
    /// time.
    Trickle(Duration),
    /// Answers status and headers at once, then the body a byte at a time, this far apart.
    TrickleBody(Duration),
}

/// The running receiver; stops when dropped.
pub struct Hostile {
    pub url: String,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Hostile {
    /// Starts a receiver that treats every request with `hostility`.
    pub async fn start(hostility: Hostility) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicU64::new(0));
        let (seen, count) = (arrivals.clone(), written.clone());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                seen.lock().unwrap().push(Instant::now());
                connections.spawn(serve(stream, hostility.clone(), count.clone()));
            }
        });
        Hostile {
            url,
            arrivals,
            written,
            task,
        }
    }

    /// When each connection arrived.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.arrivals.lock().unwrap().clone()
    }

    /// Bytes of response written to the peer so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection it holds.
        self.task.abort();
    }
}

async fn serve(mut stream: TcpStream, hostility: Hostility, written: Arc<AtomicU64>) {
    if read_request(&mut stream).await.is_none() {
        return;
    }
    let mut out = Out {
        stream,
        written: &written,
    };
    match hostility {
        Hostility::Hang => std::future::pending::<()>().await,
        Hostility::Reset => {
            let _ = out.stream.set_zero_linger();
        }
        Hostility::Garbage => {
            out.send(b"\x00\xff\xfeSSH-2.0-not-http\r\n\x16\x03\x01garbage\r\n\r\n")
                .await;
        }
        Hostility::HugeBody(len) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len}\r\n\r\n"
            );
            if out.send(head.as_bytes()).await {
                let chunk = vec![b'x'; 64 * 1024];
                let mut left = len;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if !out.send(&chunk[..n]).await {
                        break;
                    }
                    left -= n as u64;
                }
            }
        }
        Hostility::Redirect(location) => {
            let head =
                format!("HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n");
            out.send(head.as_bytes()).await;
        }
        Hostility::Trickle(every) => {
            for byte in b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" {
                if !out.send(&[*byte]).await {
                    break;
                }
                tokio::time::sleep(every).await;
            }
        }
        Hostility::TrickleBody(every) => {
            let body = vec![b'.'; 4096];
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
            if out.send(head.as_bytes()).await {
                for byte in body {
                    if !out.send(&[byte]).await {
                        break;
                    }
                    tokio::time::sleep(every).await;
                }
            }
        }
    }
}

/// The connection's write side, counting what reaches the peer.
struct Out<'a> {
    stream: TcpStream,
    written: &'a AtomicU64,
}

impl Out<'_> {
    /// Writes `bytes`; false once the peer is gone.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        let ok = self.stream.write_all(bytes).await.is_ok();
        if ok {
            self.written.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    }
}

/// Reads one request: the head, then a body of its `Content-Length`.
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf)
}
