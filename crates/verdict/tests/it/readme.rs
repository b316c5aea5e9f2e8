//! The README's walk-through, run as printed: tenant, serve, listen, send, callback.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// A port that is free, with the one after it free too.
fn free_port_pair() -> u16 {
    loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

#[test]
fn readme_walkthrough_runs_as_printed() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let block = readme
        .split("<!-- walkthrough:start -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- walkthrough:end -->").next())
        .expect("the README marks its walk-through");
    let script: String = block
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(script.contains("verdict send"), "{script}");

    let dir = std::env::temp_dir().join(format!("verdict-readme-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_verdict"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&dir)
        .env("PATH", path)
        // Not the default ports, which something else may hold: one variable moves them.
        .env("PORT", free_port_pair().to_string())
        .env_remove("VERDICT_MASTER_KEY")
        .env_remove("VERDICT_LISTEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let out = std::io::read_to_string(stdout).unwrap_or_default();
        let err = std::io::read_to_string(stderr).unwrap_or_default();
        let _ = tx.send((out, err));
    });
    let result = rx.recv_timeout(std::time::Duration::from_secs(60));
    // Whatever happened, stop anything the script left running.
    let _ = Command::new("kill")
        .args(["-9", "--", &format!("-{pgid}")])
        .status();
    let _ = child.wait();
    let (stdout, stderr) = result.expect("the walk-through did not finish within 60 s");
    let logs = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
    std::fs::remove_dir_all(&dir).ok();

    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let decision: serde_json::Value = serde_json::from_str(lines.next().unwrap_or(""))
        .unwrap_or_else(|_| {
            panic!("no decision printed.\nstdout:\n{stdout}\nstderr:\n{stderr}\nserve.log:\n{logs}")
        });
    assert_eq!(decision["decision"], "deny", "{stdout}");
    let callbacks: Vec<&str> = lines.collect();
    assert_eq!(
        callbacks.len(),
        1,
        "one callback, received once: {stdout}\n{stderr}\n{logs}"
    );
    let callback: serde_json::Value = serde_json::from_str(callbacks[0]).unwrap();
    assert_eq!(callback["event_id"], decision["event_id"]);
    assert_eq!(callback["metadata"]["ticket"], "T-1");
}
