//! No raw phone number, account id, idempotency key or secret reaches the database or the logs.

use crate::common::{Backend, Server, TestDb, new_key, now, signed, sim_swap};

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

async fn database_dump_and_logs_hold_no_raw_identifiers_or_keys(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);

    let phones: Vec<String> = (0..5).map(|i| format!("+4477009{i:05}")).collect();
    let account = "acct-7f3a-known-identifier";
    let mut keys = Vec::new();
    for phone in &phones {
        let key = new_key();
        let body = sim_swap(phone);
        assert_eq!(server.send(&tenant, Some(&key), &body).await.status, 200);
        // A replay and a mismatch exercise the other paths.
        assert!(server.send(&tenant, Some(&key), &body).await.replayed());
        assert_eq!(
            server
                .send(&tenant, Some(&key), &sim_swap("+15550001111"))
                .await
                .status,
            422
        );
        keys.push(key);
    }
    let account_body = format!(
        r#"{{"type":"credential_breach","subject":{{"account":"{account}"}},"observed_at":"2026-11-30T00:00:00Z"}}"#
    );
    let account_key = new_key();
    assert_eq!(
        server
            .send(&tenant, Some(&account_key), &account_body)
            .await
            .status,
        200
    );
    keys.push(account_key);
    // A refused request carrying a phone number and a key.
    let bad_phone = r#"{"type":"sim_swap","subject":{"phone":"+0447700999999"},"observed_at":"2026-11-30T00:00:00Z"}"#;
    let refused = signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        &tenant,
        Some("refused-key-secret-value"),
        bad_phone,
        now(),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(refused.status(), 400);

    let logs = server.logs();
    assert!(
        logs.contains("finished processing request"),
        "logging is on: {logs}"
    );
    server.kill();
    let dump = db.dump();
    assert!(
        contains(&dump, "signal") || contains(&dump, "sim_swap"),
        "the dump has content"
    );

    let mut needles: Vec<&str> = phones.iter().map(String::as_str).collect();
    needles.push(account);
    needles.push("+0447700999999");
    needles.push("refused-key-secret-value");
    needles.extend(keys.iter().map(String::as_str));
    needles.push(&tenant.api_key);
    let secret_b64 = tenant.signing_secret.trim_start_matches("whsec_");
    let webhook_b64 = tenant.webhook_secret.trim_start_matches("whsec_");
    needles.push(secret_b64);
    needles.push(webhook_b64);
    for needle in needles {
        assert!(!contains(&dump, needle), "the database holds {needle}");
        assert!(!logs.contains(needle), "the logs hold {needle}");
        // Also without the leading plus, as digits alone.
        let digits = needle.trim_start_matches('+');
        if needle.starts_with('+') {
            assert!(!contains(&dump, digits), "the database holds {digits}");
            assert!(!logs.contains(digits), "the logs hold {digits}");
        }
    }
}

async fn an_identifier_in_a_path_or_query_reaches_neither_logs_nor_errors(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let phone = "+447700900777";
    for path in [
        format!("/v1/events/{phone}"),
        format!("/v1/subjects/{phone}"),
        format!("/v1/deliveries/{phone}"),
        format!("/v1/no-such-route/{phone}"),
        format!("/v1/deliveries?status={phone}"),
    ] {
        let reply = server.get(&tenant, &path).await;
        assert!(
            (400..500).contains(&reply.status),
            "{path}: {}",
            reply.status
        );
        assert!(
            !reply.text().contains("447700900777"),
            "{path} echoed the identifier: {}",
            reply.text()
        );
    }
    let logs = server.logs();
    assert!(
        !logs.contains("447700900777"),
        "an identifier in a request path or query reached the logs"
    );
    // The route is logged by its template.
    assert!(logs.contains("/v1/events/{id}"), "no route template logged");
}

async fn api_responses_are_neither_cached_nor_sniffed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900778");
    let fresh = server.send(&tenant, Some(&key), &body).await;
    let replayed = server.send(&tenant, Some(&key), &body).await;
    assert!(replayed.replayed());
    let listed = server.get(&tenant, "/v1/events").await;
    let refused = server
        .get(
            &crate::common::Tenant {
                api_key: "vk_not-a-key".into(),
                ..tenant.clone()
            },
            "/v1/events",
        )
        .await;
    for (what, reply) in [
        ("a decision", &fresh),
        ("a replay", &replayed),
        ("a list", &listed),
        ("a 401", &refused),
    ] {
        assert_eq!(reply.header("cache-control"), Some("no-store"), "{what}");
        assert_eq!(
            reply.header("x-content-type-options"),
            Some("nosniff"),
            "{what}"
        );
    }
}

on_both_backends!(
    database_dump_and_logs_hold_no_raw_identifiers_or_keys,
    an_identifier_in_a_path_or_query_reaches_neither_logs_nor_errors,
    api_responses_are_neither_cached_nor_sniffed,
);
