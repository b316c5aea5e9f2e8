//! How the binary treats its operator: a readable master-key file is refused with the fix,
//! and logs written to a file carry no terminal colour codes.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::common::{Backend, Server, TestDb};

#[test]
fn serve_refuses_a_master_key_file_others_can_read() {
    let dir = std::env::temp_dir().join(format!("verdict-key-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("verdict.db");
    let key_file = dir.join("verdict.db.master-key");
    std::fs::write(&key_file, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("VERDICT_DATABASE_URL", format!("sqlite://{}", db.display()))
        .env_remove("VERDICT_MASTER_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "serve started with a world-readable key: {stderr}"
    );
    assert!(
        stderr.contains(&format!("chmod 600 {}", key_file.display())),
        "the error names the file and the fix: {stderr}"
    );
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["tenant", "create", "--name", "ok", "--json"])
        .env("VERDICT_DATABASE_URL", format!("sqlite://{}", db.display()))
        .env_remove("VERDICT_MASTER_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

async fn logs_to_a_pipe_carry_no_colour_codes(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[("VERDICT_LOG_FORMAT", "text")]);
    let reply = server
        .client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let logs = server.logs();
    assert!(logs.contains("listening on"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escape codes in logs: {logs:?}"
    );
}

on_both_backends!(logs_to_a_pipe_carry_no_colour_codes);
