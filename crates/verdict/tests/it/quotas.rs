//! Per-tenant bounds on what a tenant can make verdict store or answer: at most 100 live API
//! keys (race-free, checked in the statement that inserts), and the key listing in pages.

use std::sync::Arc;

use crate::common::{Backend, Reply, Server, Tenant, TestDb};
use serde_json::{Value, json};

/// A request with `tenant`'s API key.
fn authed(
    server: &Server,
    tenant: &Tenant,
    method: reqwest::Method,
    path: &str,
) -> reqwest::RequestBuilder {
    server
        .client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(&tenant.api_key)
}

async fn issue(server: &Server, tenant: &Tenant) -> Reply {
    let req =
        authed(server, tenant, reqwest::Method::POST, "/v1/keys").json(&json!({"scope": "read"}));
    Reply::from(req.send().await.unwrap()).await
}

/// Sends `requests` together, each as soon as all are ready, and returns their replies.
async fn all_at_once(requests: Vec<reqwest::RequestBuilder>) -> Vec<Reply> {
    let ready = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let mut replies = tokio::task::JoinSet::new();
    for req in requests {
        let ready = ready.clone();
        replies.spawn(async move {
            ready.wait().await;
            Reply::from(req.send().await.unwrap()).await
        });
    }
    replies.join_all().await
}

fn assert_quota_exceeded(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 422, "{what}: {}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    let problem = reply.json();
    assert_eq!(
        problem["type"], "https://verdict.dev/problems/quota-exceeded",
        "{what}: {problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("100 live API keys"),
        "{what}: {problem}"
    );
}

async fn live_keys(db: &TestDb) -> i64 {
    db.scalar("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL")
        .await
}

async fn a_tenant_holds_at_most_100_live_keys_however_many_are_issued_at_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let server = Server::start(&db, &[]);

    // `tenant create`'s admin key and 98 more: one place left.
    for n in 0..98 {
        let reply = issue(&server, &tenant).await;
        assert_eq!(reply.status, 201, "key {n}: {}", reply.text());
    }
    // Eight at once for the one place: each counts and inserts, so without the two being one
    // step several would see 99 and go in. Eight reads first open the connections, so the
    // issues arrive together rather than each behind a connect.
    let reads = (0..8)
        .map(|_| authed(&server, &tenant, reqwest::Method::GET, "/v1/keys"))
        .collect();
    for read in all_at_once(reads).await {
        assert_eq!(read.status, 200, "{}", read.text());
    }
    let issues = (0..8)
        .map(|_| {
            authed(&server, &tenant, reqwest::Method::POST, "/v1/keys")
                .json(&json!({"scope": "ingest"}))
        })
        .collect();
    let replies = all_at_once(issues).await;
    let created = replies.iter().filter(|r| r.status == 201).count();
    assert_eq!(created, 1, "one of eight concurrent issues goes in");
    for refused in replies.iter().filter(|r| r.status != 201) {
        assert_quota_exceeded(refused, "a concurrent 101st key");
    }
    assert_eq!(
        live_keys(&db).await,
        101,
        "100 for the tenant, 1 for the other"
    );

    assert_quota_exceeded(&issue(&server, &tenant).await, "a 101st key");
    let cli = db.cli_output(
        &[
            "tenant", "key", "create", "--tenant", &tenant.id, "--scope", "read",
        ],
        &[],
    );
    assert!(!cli.status.success(), "the CLI is held to the same quota");
    assert!(
        String::from_utf8_lossy(&cli.stderr).contains("100 live API keys"),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    // Another tenant has its own quota.
    assert_eq!(issue(&server, &other).await.status, 201);

    // A revoked key frees its place, and only one.
    let page = Reply::from(
        authed(&server, &tenant, reqwest::Method::GET, "/v1/keys?limit=500")
            .send()
            .await
            .unwrap(),
    )
    .await
    .json();
    let last = page["data"].as_array().unwrap().last().unwrap()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let revoked = authed(
        &server,
        &tenant,
        reqwest::Method::DELETE,
        &format!("/v1/keys/{last}"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(revoked.status(), 204);
    assert_eq!(issue(&server, &tenant).await.status, 201);
    assert_quota_exceeded(
        &issue(&server, &tenant).await,
        "a 101st key after a revocation",
    );
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM api_keys").await,
        100 + 1 + 2,
        "the tenant's 100 live and 1 revoked, the other tenant's 2"
    );
}

/// Every page of `GET /v1/keys` at `limit`, following `next_cursor`.
async fn pages(server: &Server, tenant: &Tenant, limit: &str) -> Vec<Value> {
    let mut pages = Vec::new();
    let mut path = format!("/v1/keys?limit={limit}");
    loop {
        let reply = Reply::from(
            authed(server, tenant, reqwest::Method::GET, &path)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        let page = reply.json();
        let next = page["next_cursor"].clone();
        pages.push(page);
        match next.as_str() {
            Some(cursor) => path = format!("/v1/keys?limit={limit}&after={cursor}"),
            None => return pages,
        }
        assert!(pages.len() < 100, "the cursor never ends");
    }
}

fn ids(pages: &[Value]) -> Vec<String> {
    pages
        .iter()
        .flat_map(|p| p["data"].as_array().unwrap().clone())
        .map(|k| k["key_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn the_key_list_comes_in_pages_oldest_first_with_a_cursor(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let mut issued = Vec::new();
    for _ in 0..60 {
        let reply = issue(&server, &tenant).await;
        assert_eq!(reply.status, 201, "{}", reply.text());
        issued.push(reply.json()["key_id"].as_str().unwrap().to_owned());
    }
    let other_key = issue(&server, &other).await.json()["key_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let by_25 = pages(&server, &tenant, "25").await;
    let sizes: Vec<usize> = by_25
        .iter()
        .map(|p| p["data"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [25, 25, 11], "61 keys, 25 a page");
    let listed = ids(&by_25);
    assert_eq!(listed[1..], issued[..], "oldest first, after the admin key");

    // The default page is 50; a limit outside 1 to 500 is brought within.
    let (srv, ten) = (&server, &tenant);
    let get = |path: &'static str| async move {
        Reply::from(
            authed(srv, ten, reqwest::Method::GET, path)
                .send()
                .await
                .unwrap(),
        )
        .await
        .json()
    };
    let default = get("/v1/keys").await;
    assert_eq!(default["data"].as_array().unwrap().len(), 50);
    assert_eq!(default["next_cursor"], listed[49].as_str());
    let one = get("/v1/keys?limit=0").await;
    assert_eq!(one["data"].as_array().unwrap().len(), 1);
    assert_eq!(one["next_cursor"], listed[0].as_str());
    let all = pages(&server, &tenant, "100000").await;
    assert_eq!(all.len(), 1);
    assert_eq!(ids(&all), listed);

    // A cursor that is not a UUID is a 400; another tenant's key starts no page of ours.
    let bad = Reply::from(
        authed(
            &server,
            &tenant,
            reqwest::Method::GET,
            "/v1/keys?after=nope",
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    let theirs = Reply::from(
        authed(
            &server,
            &tenant,
            reqwest::Method::GET,
            &format!("/v1/keys?after={other_key}"),
        )
        .send()
        .await
        .unwrap(),
    )
    .await
    .json();
    assert_eq!(theirs["data"], json!([]), "{theirs}");
    assert_eq!(theirs["next_cursor"], Value::Null);

    // The CLI lists them all, following the pages itself.
    let out = db.cli(&["tenant", "key", "list", "--tenant", &tenant.id, "--json"]);
    let cli: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(cli.len(), 61);

    // Revoked keys are listed too (and count toward no quota): 520 more make a page of 500.
    let hex = tenant.id.replace('-', "");
    db.exec(match db.backend {
        Backend::Sqlite => format!(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 520) \
             INSERT INTO api_keys (id, tenant_id, key_hash, scope, created_at, revoked_at) \
             SELECT randomblob(16), X'{hex}', randomblob(32), 'read', 4000000000000 + i, 1 FROM n"
        ),
        Backend::Postgres => format!(
            "INSERT INTO api_keys (id, tenant_id, key_hash, scope, created_at, revoked_at) \
             SELECT gen_random_uuid(), '{}'::uuid, decode(md5(random()::text || i), 'hex'), \
             'read', 4000000000000 + i, 1 FROM generate_series(1, 520) i",
            tenant.id
        ),
    })
    .await;
    let capped = get("/v1/keys?limit=100000").await;
    assert_eq!(capped["data"].as_array().unwrap().len(), 500);
    assert!(capped["next_cursor"].is_string());
    assert_eq!(pages(&server, &tenant, "500").await.len(), 2, "581 keys");
    assert_eq!(
        issue(&server, &tenant).await.status,
        201,
        "revoked keys count toward no quota"
    );
}

async fn a_tenant_past_its_events_for_the_day_is_refused_on_every_instance(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let env = [
        ("VERDICT_MAX_EVENTS_PER_TENANT_PER_DAY", "3"),
        ("VERDICT_QUOTA_SYNC_SECS", "1"),
    ];
    // Two instances share one count through the database.
    let (a, b) = (Server::start(&db, &env), Server::start(&db, &env));
    for (n, server) in [&a, &b, &a].into_iter().enumerate() {
        let phone = format!("+44770090090{n}");
        let reply = server
            .send(
                &tenant,
                Some(&crate::common::new_key()),
                &crate::common::sim_swap(&phone),
            )
            .await;
        assert_eq!(reply.status, 200, "signal {n}: {}", reply.text());
    }
    // Once each has shared and read the counts, both refuse the fourth, claiming nothing.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    for server in [&a, &b] {
        let refused = server
            .send(
                &tenant,
                Some(&crate::common::new_key()),
                &crate::common::sim_swap("+447700900909"),
            )
            .await;
        assert_eq!(refused.status, 429, "{}", refused.text());
        assert_eq!(
            refused.json()["type"],
            "https://verdict.dev/problems/quota-exceeded"
        );
        let retry: u32 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=86_400).contains(&retry), "{retry}");
    }
    assert_eq!(db.count("events").await, 3);
    assert_eq!(db.count("idempotency_keys").await, 3);
    // Another tenant has its own day.
    let elsewhere = b
        .send(
            &other,
            Some(&crate::common::new_key()),
            &crate::common::sim_swap("+447700900910"),
        )
        .await;
    assert_eq!(elsewhere.status, 200, "{}", elsewhere.text());
}

async fn a_signals_metadata_is_stored_once_and_read_back_whole(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = crate::common::receiver::Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let quiet = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let pad = "x".repeat(60_000);
    let body = |phone: &str| {
        let mut signal: Value = serde_json::from_str(&crate::common::sim_swap(phone)).unwrap();
        signal["metadata"] = json!({"pad": pad, "ref": "case-1"});
        signal.to_string()
    };
    let reply = server
        .send(
            &tenant,
            Some(&crate::common::new_key()),
            &body("+447700900950"),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let event_id = reply.json()["event_id"].as_str().unwrap().to_owned();

    // Once, in the event: the callback's outbox row keeps no copy of the envelope the event
    // renders.
    assert!(
        db.scalar("SELECT COALESCE(SUM(LENGTH(metadata)), 0) FROM events")
            .await
            > 60_000
    );
    assert_eq!(
        db.scalar("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM deliveries")
            .await,
        0,
        "the metadata is stored in the callback as well as in its event"
    );
    // Read back whole from the API, and sent whole in the callback.
    let shown = server.event(&tenant, &event_id).await;
    assert_eq!(
        shown["metadata"]["pad"].as_str().map(str::len),
        Some(60_000)
    );
    assert_eq!(shown["metadata"]["ref"], "case-1");
    let listed = server.get(&tenant, "/v1/events?limit=1").await;
    assert_eq!(listed.json()["data"][0]["metadata"]["ref"], "case-1");
    for _ in 0..50 {
        if !receiver.received().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let sent = receiver.received();
    assert_eq!(sent.len(), 1);
    let envelope: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(
        envelope["metadata"]["pad"].as_str().map(str::len),
        Some(60_000)
    );

    // Without a callback of its own, the event keeps it.
    let reply = server
        .send(
            &quiet,
            Some(&crate::common::new_key()),
            &body("+447700900951"),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let shown = server
        .event(&quiet, reply.json()["event_id"].as_str().unwrap())
        .await;
    assert_eq!(shown["metadata"]["ref"], "case-1");
    assert!(
        db.scalar("SELECT COALESCE(SUM(LENGTH(metadata)), 0) FROM events")
            .await
            > 120_000
    );
}

on_both_backends!(
    a_signals_metadata_is_stored_once_and_read_back_whole,
    a_tenant_past_its_events_for_the_day_is_refused_on_every_instance,
    a_tenant_holds_at_most_100_live_keys_however_many_are_issued_at_once,
    the_key_list_comes_in_pages_oldest_first_with_a_cursor,
);
