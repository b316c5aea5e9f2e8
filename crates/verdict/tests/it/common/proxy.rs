//! A fault-injecting HTTP/1.1 proxy on 127.0.0.1: one request per connection, each handled by
//! the next scripted fault, then forwarded faithfully.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Pass the request on and the response back.
    Forward,
    /// Answer 503 without passing the request on.
    Answer503,
    /// Pass the request on, let the far side finish, then close without answering: a response
    /// lost on the way back.
    DropResponse,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Proxies to `upstream` (`host:port`), applying `faults` to the first requests in order.
    pub async fn start(upstream: String, faults: Vec<Fault>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let faults = Arc::new(Mutex::new(faults.into_iter().rev().collect::<Vec<_>>()));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let fault = faults.lock().unwrap().pop().unwrap_or(Fault::Forward);
                tokio::spawn(handle(client, upstream.clone(), fault));
            }
        });
        Proxy { url, task }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(mut client: TcpStream, upstream: String, fault: Fault) {
    let Some(request) = read_request(&mut client).await else {
        return;
    };
    if fault == Fault::Answer503 {
        let _ = client
            .write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(&upstream).await else {
        return;
    };
    if server.write_all(&request).await.is_err() {
        return;
    }
    let mut response = Vec::new();
    let _ = server.read_to_end(&mut response).await;
    if fault == Fault::Forward {
        let _ = client.write_all(&response).await;
    }
    // DropResponse: the connection closes with nothing written.
}

/// Reads one request (headers and a Content-Length body) and rewrites it to close the
/// upstream connection after answering, so the response can be read to its end.
async fn read_request(client: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < header_end + length {
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut lines: Vec<&str> = head
        .trim_end()
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    lines.push("connection: close");
    let mut out = (lines.join("\r\n") + "\r\n\r\n").into_bytes();
    out.extend_from_slice(&buf[header_end..header_end + length]);
    Some(out)
}
