//! API keys carry a scope (`ingest`, `read`, `admin`), are issued, listed and revoked with the
//! CLI or the API, and a revoked key stops working within 5 seconds.

use std::time::{Duration, Instant};

use crate::common::{Backend, Reply, Server, Tenant, TestDb, new_key, now, signed, sim_swap};
use serde_json::{Value, json};

const PLAYBOOK: &str = r#"
[[rule]]
name = "deny_swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = []
"#;

/// Sends a request with `tenant`'s API key.
async fn call(
    server: &Server,
    tenant: &Tenant,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Reply {
    let mut req = server
        .client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(&tenant.api_key);
    if let Some(body) = body {
        req = req.json(&body);
    }
    Reply::from(req.send().await.unwrap()).await
}

async fn put_playbook(server: &Server, tenant: &Tenant) -> Reply {
    Reply::from(
        server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(PLAYBOOK)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Asserts a 403 insufficient-scope problem.
fn assert_forbidden(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        403,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.json()["type"],
        "https://verdict.dev/problems/insufficient-scope",
        "{what}"
    );
}

async fn read_key_cannot_post_signals_403(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);
    let key = new_key();
    let body = sim_swap("+447700900501");

    let refused = server.send(&reader, Some(&key), &body).await;
    assert_forbidden(&refused, "a read key sending a signal");
    assert_eq!(
        db.count("idempotency_keys").await,
        0,
        "a refused signal claimed its key"
    );
    assert_eq!(db.count("events").await, 0);

    // The key was never occupied: the same key and body with an admin key is processed afresh.
    let ok = server.send(&tenant, Some(&key), &body).await;
    assert_eq!(ok.status, 200);
    assert!(!ok.replayed());
}

async fn ingest_key_may_only_post_signals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (_, ingester) = db.issue_key(&tenant, "ingest");
    let server = Server::start(&db, &[]);

    let sent = server
        .send(&ingester, Some(&new_key()), &sim_swap("+447700900502"))
        .await;
    assert_eq!(sent.status, 200, "{}", String::from_utf8_lossy(&sent.body));
    let event_id = sent.json()["event_id"].as_str().unwrap().to_owned();

    use reqwest::Method;
    for (method, path) in [
        (Method::GET, "/v1/events".to_owned()),
        (Method::GET, format!("/v1/events/{event_id}")),
        (Method::GET, "/v1/deliveries".to_owned()),
        (Method::GET, "/v1/playbook".to_owned()),
        (Method::GET, "/v1/keys".to_owned()),
        (
            Method::POST,
            format!("/v1/deliveries/{}/redeliver", new_key()),
        ),
    ] {
        let reply = call(&server, &ingester, method.clone(), &path, None).await;
        assert_forbidden(&reply, &format!("ingest key: {method} {path}"));
    }
    assert_forbidden(&put_playbook(&server, &ingester).await, "ingest key: PUT");
}

async fn read_key_reads_but_cannot_change_anything(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);
    let sent = server
        .send(&tenant, Some(&new_key()), &sim_swap("+447700900503"))
        .await;
    let event_id = sent.json()["event_id"].as_str().unwrap().to_owned();
    let event = server.event(&reader, &event_id).await;
    let subject_hash = event["subject_hash"].as_str().unwrap().to_owned();

    for path in [
        "/v1/events".to_owned(),
        format!("/v1/subjects/{subject_hash}"),
        "/v1/deliveries?status=pending".to_owned(),
        "/v1/playbook".to_owned(),
    ] {
        let reply = server.get(&reader, &path).await;
        assert_eq!(reply.status, 200, "read key: GET {path}");
    }

    use reqwest::Method;
    assert_forbidden(&put_playbook(&server, &reader).await, "read key: PUT");
    for (method, path, body) in [
        (
            Method::POST,
            format!("/v1/deliveries/{}/redeliver", new_key()),
            None,
        ),
        (Method::GET, "/v1/keys".to_owned(), None),
        (
            Method::POST,
            "/v1/keys".to_owned(),
            Some(json!({"scope": "admin"})),
        ),
        (Method::DELETE, format!("/v1/keys/{}", new_key()), None),
    ] {
        let reply = call(&server, &reader, method.clone(), &path, body).await;
        assert_forbidden(&reply, &format!("read key: {method} {path}"));
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM api_keys").await,
        2,
        "a read key issued no key"
    );
}

async fn admin_key_issues_lists_and_revokes_keys_over_the_api(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    use reqwest::Method;

    let created = call(
        &server,
        &tenant,
        Method::POST,
        "/v1/keys",
        Some(json!({"scope": "read"})),
    )
    .await;
    assert_eq!(created.status, 201);
    let issued = created.json();
    assert_eq!(issued["scope"], "read");
    let api_key = issued["api_key"].as_str().unwrap().to_owned();
    let key_id = issued["key_id"].as_str().unwrap().to_owned();
    assert!(api_key.starts_with("vk_"));
    let reader = Tenant {
        api_key: api_key.clone(),
        ..tenant.clone()
    };
    assert_eq!(server.get(&reader, "/v1/events").await.status, 200);

    let listed = call(&server, &tenant, Method::GET, "/v1/keys", None).await;
    assert_eq!(listed.status, 200);
    let keys = listed.json()["data"].as_array().unwrap().clone();
    assert_eq!(
        keys.len(),
        2,
        "the admin key from `tenant create`, then the new one"
    );
    assert_eq!(keys[0]["scope"], "admin");
    assert_eq!(keys[1]["key_id"], key_id.as_str());
    assert_eq!(keys[1]["revoked_at"], Value::Null);
    let text = String::from_utf8(listed.body.clone()).unwrap();
    assert!(
        !text.contains(&api_key) && !text.contains(&tenant.api_key),
        "a listing never shows a key"
    );

    for bad in [json!({"scope": "root"}), json!({}), json!({"scope": 1})] {
        let reply = call(&server, &tenant, Method::POST, "/v1/keys", Some(bad)).await;
        assert_eq!(reply.status, 400);
        assert_eq!(
            reply.json()["type"],
            "https://verdict.dev/problems/invalid-request"
        );
    }

    // Another tenant's key, an unknown id and a malformed one are all 404.
    let (other_key_id, other_reader) = db.issue_key(&other, "read");
    for id in [other_key_id.as_str(), &new_key(), "not-a-uuid"] {
        let reply = call(
            &server,
            &tenant,
            Method::DELETE,
            &format!("/v1/keys/{id}"),
            None,
        )
        .await;
        assert_eq!(reply.status, 404, "DELETE /v1/keys/{id}");
    }
    assert_eq!(server.get(&other_reader, "/v1/events").await.status, 200);

    let revoked = call(
        &server,
        &tenant,
        Method::DELETE,
        &format!("/v1/keys/{key_id}"),
        None,
    )
    .await;
    assert_eq!(revoked.status, 204);
    // Revoked on this instance at once.
    let refused = server.get(&reader, "/v1/events").await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.json()["type"],
        "https://verdict.dev/problems/invalid-api-key"
    );
    let again = call(
        &server,
        &tenant,
        Method::DELETE,
        &format!("/v1/keys/{key_id}"),
        None,
    )
    .await;
    assert_eq!(again.status, 204, "revoking a revoked key is a no-op");
    let listed = call(&server, &tenant, Method::GET, "/v1/keys", None).await;
    assert!(listed.json()["data"][1]["revoked_at"].is_string());
}

async fn revoked_key_is_refused_within_5_seconds(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (ingest_id, ingester) = db.issue_key(&tenant, "ingest");
    let (read_id, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);

    // A completed keyed signal, and the exact request again: the no-database replay path.
    let body = sim_swap("+447700900504");
    let key = new_key();
    let at = now();
    let post = || {
        signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            &ingester,
            Some(&key),
            &body,
            at,
        )
    };
    assert_eq!(Reply::from(post().send().await.unwrap()).await.status, 200);
    let replay = Reply::from(post().send().await.unwrap()).await;
    assert!(replay.replayed());
    assert_eq!(server.get(&reader, "/v1/events").await.status, 200);

    // Revoked by another process (as another instance would be): the cache must not outlive it.
    db.cli(&[
        "tenant", "key", "revoke", "--tenant", &tenant.id, "--key-id", &ingest_id,
    ]);
    db.cli(&[
        "tenant", "key", "revoke", "--tenant", &tenant.id, "--key-id", &read_id,
    ]);
    let revoked_at = Instant::now();
    let mut replay_refused = None;
    let mut read_refused = None;
    while (replay_refused.is_none() || read_refused.is_none())
        && revoked_at.elapsed() < Duration::from_secs(7)
    {
        if replay_refused.is_none() && Reply::from(post().send().await.unwrap()).await.status == 401
        {
            replay_refused = Some(revoked_at.elapsed());
        }
        if read_refused.is_none() && server.get(&reader, "/v1/events").await.status == 401 {
            read_refused = Some(revoked_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replay_refused = replay_refused.expect("the revoked ingest key still replayed after 7 s");
    let read_refused = read_refused.expect("the revoked read key still read after 7 s");
    // Both were cached before the revocation, so both expire within 5 s of it; the rest is
    // the polling's own time.
    let bound = Duration::from_secs(6);
    assert!(
        replay_refused <= bound && read_refused <= bound,
        "refused after {replay_refused:?} and {read_refused:?}, not within 5 s"
    );
    // And it stays refused: a revoked key is never cached again.
    assert_eq!(Reply::from(post().send().await.unwrap()).await.status, 401);
    assert_eq!(server.get(&tenant, "/v1/events").await.status, 200);
}

async fn a_read_key_gets_no_replay_from_the_fast_path(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);
    // The read key is cached, and a completed response sits in the replay cache.
    assert_eq!(server.get(&reader, "/v1/events").await.status, 200);
    let body = sim_swap("+447700900505");
    let key = new_key();
    let at = now();
    let send = |who: &Tenant| {
        signed(
            server.client.post(format!("{}/v1/signals", server.base)),
            who,
            Some(&key),
            &body,
            at,
        )
        .send()
    };
    assert_eq!(Reply::from(send(&tenant).await.unwrap()).await.status, 200);
    assert!(Reply::from(send(&tenant).await.unwrap()).await.replayed());

    let refused = Reply::from(send(&reader).await.unwrap()).await;
    assert_forbidden(&refused, "a read key replaying a signal");
    assert!(!refused.replayed());
}

async fn keys_are_listed_without_the_key_and_record_their_last_use(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (read_id, reader) = db.issue_key(&tenant, "read");
    let list = || -> Vec<Value> {
        let out = db.cli(&["tenant", "key", "list", "--tenant", &tenant.id, "--json"]);
        assert!(!out.contains(&tenant.api_key) && !out.contains(&reader.api_key));
        serde_json::from_str(&out).unwrap()
    };
    let keys = list();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0]["scope"], "admin",
        "`tenant create` issues an admin key"
    );
    assert_eq!(keys[1]["key_id"], read_id.as_str());
    assert!(keys.iter().all(|k| k["last_used_at"].is_null()));
    let text = db.cli(&["tenant", "key", "list", "--tenant", &tenant.id]);
    assert!(text.contains(&read_id) && text.contains("read") && text.contains("admin"));
    assert!(!text.contains(&reader.api_key));

    let plain = db.cli(&[
        "tenant", "key", "create", "--tenant", &tenant.id, "--scope", "ingest",
    ]);
    assert!(plain.contains("api_key  vk_") && plain.contains("scope    ingest"));

    let server = Server::start(&db, &[]);
    for _ in 0..3 {
        assert_eq!(server.get(&reader, "/v1/events").await.status, 200);
    }
    // Recorded off the request path, so poll briefly.
    let started = Instant::now();
    loop {
        let keys = list();
        if keys[1]["last_used_at"].is_string() {
            assert!(
                keys[0]["last_used_at"].is_null(),
                "the admin key was not used"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "last_used_at was not recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn keys_from_before_api_keys_existed_become_admin_keys(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The schema as it was before migration 0005, with a tenant holding its one key.
    let old = db.dir().join("migrations-0004");
    std::fs::create_dir_all(&old).unwrap();
    let dir = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    };
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dir);
    for entry in std::fs::read_dir(&all).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < "0005" {
            std::fs::copy(&path, old.join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(old.as_path()).await.unwrap();
    let api_key = "vk_an-old-key-from-before-scopes";
    let hash = verdict::secrets::api_key_hash(api_key).to_vec();
    let tenant_id = uuid::Uuid::now_v7();
    let insert_tenant = "INSERT INTO tenants (id, name, api_key_hash, \
        inbound_signature_required, callback_url, created_at) VALUES ($1, 'old', $2, FALSE, NULL, 1)";
    let insert_secret = "INSERT INTO tenant_secrets (id, tenant_id, purpose, sealed, created_at) \
        VALUES ($1, $2, 'webhook', $3, 1)";
    // Sealed under the database's master key, as that version sealed it: the key is checked
    // against it when the first sentinel is stored.
    let sealed = verdict::secrets::MasterKey::from_base64(&db.master_key)
        .unwrap()
        .keyring()
        .seal(b"whsec_old", format!("{tenant_id}/webhook").as_bytes());
    match backend {
        Backend::Sqlite => {
            let options = db
                .url
                .parse::<sqlx::sqlite::SqliteConnectOptions>()
                .unwrap()
                .create_if_missing(true)
                .foreign_keys(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            sqlx::query(insert_tenant)
                .bind(tenant_id)
                .bind(&hash)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(insert_secret)
                .bind(uuid::Uuid::now_v7())
                .bind(tenant_id)
                .bind(&sealed)
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            sqlx::query(insert_tenant)
                .bind(tenant_id)
                .bind(&hash)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(insert_secret)
                .bind(uuid::Uuid::now_v7())
                .bind(tenant_id)
                .bind(&sealed)
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
    }

    // The server migrates; the old key is now the tenant's admin key.
    let server = Server::start(&db, &[]);
    let old_key = Tenant {
        id: tenant_id.to_string(),
        api_key: api_key.to_owned(),
        signing_secret: String::new(),
        webhook_secret: String::new(),
    };
    assert_eq!(server.get(&old_key, "/v1/events").await.status, 200);
    assert_eq!(put_playbook(&server, &old_key).await.status, 201);
    let keys: Vec<Value> = serde_json::from_str(&db.cli(&[
        "tenant",
        "key",
        "list",
        "--tenant",
        &tenant_id.to_string(),
        "--json",
    ]))
    .unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["scope"], "admin");
    assert_eq!(keys[0]["created_at"], "1970-01-01T00:00:00.001Z");
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM tenant_secrets").await,
        1,
        "rows that point at the tenant survive the migration"
    );
    if backend == Backend::Sqlite {
        assert_eq!(
            db.scalar("SELECT COUNT(*) FROM pragma_foreign_key_check")
                .await,
            0
        );
    }
}

async fn the_openapi_document_describes_keys_and_refusals(backend: Backend) {
    let db = TestDb::new(backend).await;
    let server = Server::start(&db, &[]);
    let doc = server.openapi().await.json();
    let paths = &doc["paths"];
    assert!(paths["/v1/keys"]["post"]["responses"]["201"].is_object());
    assert!(paths["/v1/keys"]["get"].is_object());
    assert!(paths["/v1/keys/{key_id}"]["delete"]["responses"]["204"].is_object());
    for (path, method) in [
        ("/v1/signals", "post"),
        ("/v1/events", "get"),
        ("/v1/playbook", "put"),
    ] {
        let responses = &paths[path][method]["responses"];
        for status in ["401", "403", "429"] {
            assert!(
                responses[status].is_object(),
                "{method} {path} lacks {status}"
            );
        }
    }
    assert!(paths["/v1/events"]["get"]["responses"]["429"]["headers"]["Retry-After"].is_object());
}

on_both_backends!(
    read_key_cannot_post_signals_403,
    ingest_key_may_only_post_signals,
    read_key_reads_but_cannot_change_anything,
    admin_key_issues_lists_and_revokes_keys_over_the_api,
    revoked_key_is_refused_within_5_seconds,
    a_read_key_gets_no_replay_from_the_fast_path,
    keys_are_listed_without_the_key_and_record_their_last_use,
    keys_from_before_api_keys_existed_become_admin_keys,
    the_openapi_document_describes_keys_and_refusals,
);
