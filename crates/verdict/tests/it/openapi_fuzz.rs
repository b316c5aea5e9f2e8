//! The OpenAPI document against the server it describes: schemathesis (someone else's fuzzer)
//! reads `GET /openapi.json` from the real binary and runs every operation with generated valid
//! and invalid requests, every check (`--checks all`: no 5xx, every status, content type, header
//! and body as documented, invalid data refused, valid data accepted, auth not ignored), and
//! the document's links for stateful sequences (signal → event → subject, delivery, redelivery;
//! key → revoke). Any failure fails the test with schemathesis's report.
//!
//! `tests/openapi_fuzz/schemathesis.toml` lists the few statuses the contract gives to
//! schema-valid requests for reasons JSON Schema cannot state, and `verdict_hooks.py` sends
//! `application/toml` bodies. `VERDICT_FUZZ_EXAMPLES` (default 25 per operation) and
//! `VERDICT_FUZZ_SEED` (default a fixed seed, so CI is repeatable; `random` for a new one) size
//! a longer run, e.g. `VERDICT_FUZZ_EXAMPLES=500 VERDICT_FUZZ_SEED=random cargo test --test
//! openapi_fuzz -- --nocapture`.

use std::process::Command;

use crate::common::{Backend, Server, TestDb, UNUSED_CALLBACK, new_key, sim_swap};

/// Examples per operation and phase in the CI-sized run.
const CI_EXAMPLES: &str = "25";
/// The seed of the CI-sized run.
const CI_SEED: &str = "20261130";

async fn every_operation_answers_as_the_openapi_document_says(backend: Backend) {
    let db = TestDb::new(backend).await;
    // Generated bodies cannot carry a signature, so the tenant takes unsigned signals; its
    // callbacks go to a closed port, so deliveries exist and fail fast.
    let tenant = db.tenant(&["--no-inbound-signature", "--callback-url", UNUSED_CALLBACK]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    // Events, a subject and deliveries under the default playbook before the fuzzer replaces
    // it, so the links from the list operations lead somewhere.
    for phone in ["+447700900001", "+447700900002"] {
        let reply = server
            .send(&tenant, Some(&new_key()), &sim_swap(phone))
            .await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
    }

    let examples = std::env::var("VERDICT_FUZZ_EXAMPLES").unwrap_or_else(|_| CI_EXAMPLES.into());
    let seed = std::env::var("VERDICT_FUZZ_SEED").unwrap_or_else(|_| CI_SEED.into());
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openapi_fuzz");
    let mut st = Command::new("python3");
    st.current_dir(db.dir())
        .env("PYTHONPATH", fixtures)
        .env("SCHEMATHESIS_HOOKS", "verdict_hooks")
        .args(["-m", "schemathesis.cli"])
        .args(["--config-file", &format!("{fixtures}/schemathesis.toml")])
        .args(["run", &format!("{}/openapi.json", server.base)])
        .args(["--checks", "all"])
        .args([
            "--header",
            &format!("Authorization: Bearer {}", tenant.api_key),
        ])
        .args(["--max-examples", &examples])
        .args(["--request-timeout", "10"])
        .args(["--workers", "1"])
        .arg("--no-color");
    if seed != "random" {
        st.args(["--seed", &seed]);
    }
    let out = st
        .output()
        .expect("python3 is needed to run schemathesis (pip install schemathesis)");
    let report = String::from_utf8_lossy(&out.stdout);
    let errors = String::from_utf8_lossy(&out.stderr);
    assert!(
        !errors.contains("No module named schemathesis"),
        "schemathesis is not installed: pip install schemathesis (scripts/test does)"
    );
    assert!(
        out.status.success(),
        "schemathesis found failures on {backend:?}:\n{report}\n{errors}\n--- server log tail ---\n{}",
        tail(&server.logs(), 40)
    );
    let summary: Vec<&str> = report
        .lines()
        .filter(|l| l.contains("generated") || l.contains("API Links") || l.contains(" passed"))
        .collect();
    println!("schemathesis on {backend:?}:\n{}", summary.join("\n"));
    assert!(
        report.contains("generated"),
        "schemathesis printed no summary:\n{report}\n{errors}"
    );
    assert!(
        !server.logs().contains("panicked"),
        "the server panicked during the run"
    );
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

on_both_backends!(every_operation_answers_as_the_openapi_document_says);
