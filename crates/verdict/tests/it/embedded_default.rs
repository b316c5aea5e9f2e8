//! `verdict serve` with no configuration runs on a SQLite file and creates its master key.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn serve_without_configuration_creates_a_sqlite_database_and_a_private_master_key() {
    let dir = std::env::temp_dir().join(format!("verdict-default-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(&dir)
        .env_remove("VERDICT_DATABASE_URL")
        .env_remove("VERDICT_MASTER_KEY")
        .env_remove("VERDICT_CONFIG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on http://") {
                let _ = tx.send(line);
            }
        }
    });
    let started = rx.recv_timeout(Duration::from_secs(30));
    let _ = child.kill();
    let _ = child.wait();
    assert!(started.is_ok(), "serve did not start with no configuration");
    assert!(dir.join("verdict.db").exists());
    let key = dir.join("verdict.db.master-key");
    assert!(key.exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn postgres_without_a_master_key_refuses_to_start() {
    let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
        .args(["tenant", "create", "--name", "x"])
        .env(
            "VERDICT_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/verdict_never_created",
        )
        .env_remove("VERDICT_MASTER_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("VERDICT_MASTER_KEY"));
}

#[tokio::test]
async fn migrate_creates_the_schema_and_is_idempotent() {
    let dir = std::env::temp_dir().join(format!("verdict-migrate-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("m.db").display());
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_verdict"))
            .arg("migrate")
            .env("VERDICT_DATABASE_URL", &url)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "migrations applied"
        );
    }
    // Ask the database: the schema may still sit in the WAL file rather than the main file.
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table'")
            .fetch_all(&pool)
            .await
            .unwrap();
    pool.close().await;
    for table in [
        "tenants",
        "idempotency_keys",
        "events",
        "deliveries",
        "delivery_attempts",
        "playbooks",
    ] {
        assert!(
            tables.iter().any(|t| t == table),
            "{table} missing from {tables:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
