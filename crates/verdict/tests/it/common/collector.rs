//! An OTLP/HTTP trace collector for the trace tests: `otlp_receiver.py`, which decodes every
//! export with the official `opentelemetry-proto` package (PyPI), run as a process of its own
//! on a free port of 127.0.0.1, killed on drop.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/common/otlp_receiver.py")
}

/// The running collector.
pub struct Collector {
    /// What to set `OTEL_EXPORTER_OTLP_ENDPOINT` to.
    pub endpoint: String,
    out: PathBuf,
    child: Child,
}

impl Collector {
    /// Starts one writing what it receives to a file in `dir`.
    pub fn start(dir: &Path) -> Collector {
        let out = dir.join(format!("otlp-{}.jsonl", uuid::Uuid::new_v4()));
        std::fs::write(&out, "").unwrap();
        let mut child = Command::new("python3")
            .arg(script())
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 is needed for the OTLP collector");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let port: u16 = first.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "otlp_receiver.py did not start (run `pip install opentelemetry-proto`): {first:?}"
            )
        });
        Collector {
            endpoint: format!("http://127.0.0.1:{port}"),
            out,
            child,
        }
    }

    /// Every line written so far.
    fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    /// The export requests received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.of_type("request")
    }

    /// The spans received so far.
    pub fn spans(&self) -> Vec<Value> {
        self.of_type("span")
    }

    fn of_type(&self, kind: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|line| line["type"] == kind)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
