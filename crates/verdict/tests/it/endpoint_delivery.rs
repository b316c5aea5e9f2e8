//! Several callback endpoints per tenant: a decision goes to every endpoint whose filter takes
//! it, exactly once each, with a `webhook-id` of its own and signed with that endpoint's
//! secret; through a crash of the server between the commit and the inline attempts too.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::common::receiver::{Receiver, Step};
use crate::common::{Backend, MANUAL_WORKER, Server, Tenant, TestDb, new_key, sim_swap};
use crate::console_subjects::Session;

/// SIM swaps are denied, port-outs allowed; both call back.
const PLAYBOOK: &str = r#"
[[rule]]
name = "swap"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["callback"]

[[rule]]
name = "port"
when = { type = ["port_out"] }
decision = "allow"
actions = ["callback"]
"#;

/// A port-out of `phone`, observed an hour ago.
fn port_out(phone: &str) -> String {
    sim_swap(phone).replace(r#""type":"sim_swap""#, r#""type":"port_out""#)
}

/// `PUT /v1/endpoints/{name}` with the tenant's admin key; the answer, which must be a 2xx.
async fn put_endpoint(server: &Server, tenant: &Tenant, name: &str, spec: Value) -> Value {
    let resp = server
        .client
        .put(format!("{}/v1/endpoints/{name}", server.base))
        .bearer_auth(&tenant.api_key)
        .json(&spec)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: Value = resp.json().await.unwrap();
    assert!(status.is_success(), "{status}: {body}");
    body
}

/// Three receivers behind three endpoints: `default` (the tenant's callback URL, every
/// decision, the tenant's webhook secret), `denies` (denials only) and `ports` (port-outs
/// only), each of the last two with its own secret.
struct Three {
    db: TestDb,
    tenant: Tenant,
    all: Receiver,
    denies: Receiver,
    ports: Receiver,
    /// Each endpoint's secret, by name.
    secrets: HashMap<&'static str, String>,
}

async fn three_endpoints(backend: Backend) -> Three {
    let db = TestDb::new(backend).await;
    let (all, denies, ports) = (
        Receiver::start(vec![]).await,
        Receiver::start(vec![]).await,
        Receiver::start(vec![]).await,
    );
    let tenant = db.tenant(&["--callback-url", &all.url]);
    db.set_playbook(&tenant, PLAYBOOK);
    let server = Server::start(&db, &MANUAL_WORKER);
    let made_denies = put_endpoint(
        &server,
        &tenant,
        "denies",
        json!({"url": denies.url, "filter": {"decisions": ["deny"]}}),
    )
    .await;
    let made_ports = put_endpoint(
        &server,
        &tenant,
        "ports",
        json!({"url": ports.url, "filter": {"signal_types": ["port_out"]}}),
    )
    .await;
    let mut secrets = HashMap::new();
    secrets.insert("default", tenant.webhook_secret.clone());
    for (name, made) in [("denies", &made_denies), ("ports", &made_ports)] {
        let secret = made["secret_key"].as_str().unwrap();
        assert!(secret.starts_with("whsec_"), "{made}");
        secrets.insert(name, secret.to_owned());
    }
    Three {
        db,
        tenant,
        all,
        denies,
        ports,
        secrets,
    }
}

impl Three {
    /// Each receiver's `webhook-id`s.
    fn ids(&self) -> [Vec<String>; 3] {
        [&self.all, &self.denies, &self.ports].map(|r| {
            r.received()
                .iter()
                .map(|got| got.header("webhook-id").to_owned())
                .collect()
        })
    }

    /// Every receiver's deliveries verify with its endpoint's secret under the reference
    /// library.
    fn verify(&self) {
        for (receiver, name) in [
            (&self.all, "default"),
            (&self.denies, "denies"),
            (&self.ports, "ports"),
        ] {
            if !receiver.received().is_empty() {
                receiver.verify_all_with_python(&self.secrets[name]);
            }
        }
    }
}

async fn each_matching_endpoint_gets_one_delivery_per_decision(backend: Backend) {
    let t = three_endpoints(backend).await;
    let server = Server::start(&t.db, &MANUAL_WORKER);
    let swap = server
        .send(&t.tenant, Some(&new_key()), &sim_swap("+447700900301"))
        .await;
    assert_eq!(swap.status, 200, "{}", swap.text());
    let port = server
        .send(&t.tenant, Some(&new_key()), &port_out("+447700900302"))
        .await;
    assert_eq!(port.status, 200, "{}", port.text());

    let [all, denies, ports] = t.ids();
    assert_eq!(all.len(), 2, "every decision goes to `default`: {all:?}");
    assert_eq!(
        denies.len(),
        1,
        "only the denial goes to `denies`: {denies:?}"
    );
    assert_eq!(
        ports.len(),
        1,
        "only the port-out goes to `ports`: {ports:?}"
    );
    let swap_event = swap.json()["event_id"].as_str().unwrap().to_owned();
    let port_event = port.json()["event_id"].as_str().unwrap().to_owned();
    assert_eq!(t.denies.received()[0].json()["event_id"], swap_event);
    assert_eq!(t.ports.received()[0].json()["event_id"], port_event);
    // The same decision's envelope, under a webhook-id of each endpoint's own.
    let swap_to_all = t
        .all
        .received()
        .into_iter()
        .find(|r| r.json()["event_id"] == swap_event)
        .unwrap();
    assert_eq!(swap_to_all.body, t.denies.received()[0].body);
    assert_ne!(swap_to_all.header("webhook-id"), denies[0]);
    assert_eq!(
        swap_to_all.header("webhook-id"),
        format!("msg_{}", swap_event.replace('-', "")),
        "the `default` endpoint keeps the webhook-id it always had"
    );
    t.verify();

    // The event lists one delivery per endpoint, each naming its endpoint.
    let event = server.event(&t.tenant, &swap_event).await;
    let mut endpoints: Vec<&str> = event["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["endpoint"].as_str().unwrap())
        .collect();
    endpoints.sort_unstable();
    assert_eq!(endpoints, ["default", "denies"], "{event}");
    let only_denies = server
        .get(&t.tenant, "/v1/deliveries?endpoint=denies")
        .await
        .json();
    assert_eq!(
        only_denies["data"].as_array().unwrap().len(),
        1,
        "{only_denies}"
    );
}

async fn each_endpoint_gets_one_delivery_through_a_crash_before_the_inline_attempts(
    backend: Backend,
) {
    let t = three_endpoints(backend).await;
    let key = new_key();
    let body = sim_swap("+447700900303");
    let mut env = MANUAL_WORKER.to_vec();
    env.push(("FAILPOINTS", "ingest::after_dispatch=return(abort)"));
    let doomed = Server::start(&t.db, &env);
    doomed
        .send_raw_expecting_crash(&t.tenant, &key, &body)
        .await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted after the commit"
    );
    assert!(
        t.all.received().is_empty() && t.denies.received().is_empty(),
        "nothing was sent before the crash"
    );
    // Both rows are stored, leased to the inline attempts that never ran.
    assert_eq!(t.db.count("deliveries").await, 2);

    // The client's retry is answered from the stored decision; no third row, no new send.
    let server = Server::start(&t.db, &MANUAL_WORKER);
    let retry = server.send(&t.tenant, Some(&key), &body).await;
    assert_eq!(retry.status, 200, "{}", retry.text());
    assert!(retry.replayed());
    assert_eq!(t.db.count("deliveries").await, 2);

    // The leases run out (as they would after a minute) and the worker sends each row once.
    t.db.end_leases("TRUE").await;
    t.db.worker_once(&MANUAL_WORKER);
    t.db.worker_once(&MANUAL_WORKER);
    let [all, denies, ports] = t.ids();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(denies.len(), 1, "{denies:?}");
    assert!(
        ports.is_empty(),
        "a SIM swap is not the `ports` endpoint's: {ports:?}"
    );
    assert_ne!(all[0], denies[0]);
    t.verify();
    let delivered =
        t.db.scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'succeeded'")
            .await;
    assert_eq!(delivered, 2);
}

async fn a_410_disables_only_its_own_endpoint(backend: Backend) {
    let t = three_endpoints(backend).await;
    t.denies.answer_by_default(Step::status(410));
    let server = Server::start(&t.db, &MANUAL_WORKER);
    let first = server
        .send(&t.tenant, Some(&new_key()), &sim_swap("+447700900304"))
        .await;
    assert_eq!(first.status, 200, "{}", first.text());
    // The 410's record (which disables the endpoint) joins a commit after the response.
    let mut enabled = HashMap::new();
    for _ in 0..50 {
        enabled = endpoints_enabled(&server, &t.tenant).await;
        if !enabled["denies"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        enabled,
        HashMap::from([
            ("default".to_owned(), true),
            ("denies".to_owned(), false),
            ("ports".to_owned(), true)
        ])
    );
    let second = server
        .send(&t.tenant, Some(&new_key()), &sim_swap("+447700900305"))
        .await;
    assert_eq!(second.status, 200, "{}", second.text());
    let [all, denies, _] = t.ids();
    assert_eq!(all.len(), 2, "`default` still gets every decision: {all:?}");
    assert_eq!(
        denies.len(),
        1,
        "the gone endpoint was asked once, then disabled"
    );
    let suspended =
        t.db.scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'suspended'")
            .await;
    assert_eq!(
        suspended, 1,
        "the second denial waits for `denies` to be re-enabled"
    );
}

/// Whether each of the tenant's endpoints is enabled, by name.
async fn endpoints_enabled(server: &Server, tenant: &Tenant) -> HashMap<String, bool> {
    let endpoints = server.get(tenant, "/v1/endpoints").await.json();
    endpoints["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            (name, e["enabled"].as_bool().unwrap())
        })
        .collect()
}

async fn the_console_shows_no_token_from_a_url_and_each_endpoints_deliveries(backend: Backend) {
    let t = three_endpoints(backend).await;
    let server = Server::start(&t.db, &MANUAL_WORKER);
    let reply = server
        .send(&t.tenant, Some(&new_key()), &sim_swap("+447700900306"))
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let tokened = json!({"url": format!("{}?token=s3cret-token", t.all.url), "enabled": false});
    put_endpoint(&server, &t.tenant, "tokened", tokened).await;
    let session = Session::sign_in(&server, &t.tenant.api_key).await;
    let page = session.get("/console/endpoints").await;
    assert_eq!(page.status, 200);
    let html = page.text();
    for name in ["default", "denies", "ports"] {
        assert!(
            html.contains(&format!("/console/deliveries?endpoint={name}")),
            "{name} is listed: {html}"
        );
    }
    assert!(html.contains("deny"), "the filter is shown");
    assert!(!html.contains("whsec_"), "no secret on the page");
    assert!(
        !html.contains("s3cret-token"),
        "no token from a URL's query on the page"
    );
    let only_ports = session.get("/console/deliveries?endpoint=ports").await;
    let only_ports = only_ports.text();
    assert!(
        only_ports.contains("No deliveries."),
        "a SIM swap is not the ports endpoint's"
    );
    let only_denies = session.get("/console/deliveries?endpoint=denies").await;
    let only_denies = only_denies.text();
    assert!(only_denies.contains(&format!(
        "/console/events/{}",
        reply.json()["event_id"].as_str().unwrap()
    )));
}

/// The schema as it was before endpoints (migrations below `0022` on PostgreSQL, `0020` on
/// SQLite), applied to the test's database, then `statements` run on it.
async fn before_endpoints(db: &TestDb, statements: &[String]) {
    migrated_before(db, ("0020", "0022"), statements).await;
}

/// Migrates `db` up to the migrations numbered `first_after` (SQLite's, PostgreSQL's), not
/// included, then runs `statements`: rows as an older version stored them.
pub(crate) async fn migrated_before(db: &TestDb, first_after: (&str, &str), statements: &[String]) {
    let (dir, first_after) = match db.backend {
        Backend::Sqlite => ("sqlite", first_after.0),
        Backend::Postgres => ("postgres", first_after.1),
    };
    let old = db.dir().join(format!("migrations-before-{first_after}"));
    std::fs::create_dir_all(&old).unwrap();
    let all = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dir);
    for entry in std::fs::read_dir(&all).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < first_after {
            std::fs::copy(&path, old.join(&name)).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(old.as_path()).await.unwrap();
    match db.backend {
        Backend::Sqlite => {
            let options = db
                .url
                .parse::<sqlx::sqlite::SqliteConnectOptions>()
                .unwrap()
                .create_if_missing(true)
                .foreign_keys(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            for sql in statements {
                sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            for sql in statements {
                sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            pool.close().await;
        }
    }
}

async fn a_tenants_callback_url_becomes_its_default_endpoint_with_its_deliveries(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant_id = uuid::Uuid::now_v7();
    let blob = |id| db.uuid_sql(id);
    let (tenant, event) = (blob(tenant_id), blob(uuid::Uuid::now_v7()));
    let statements = [
        format!(
            "INSERT INTO tenants (id, name, inbound_signature_required, callback_url, \
             callback_disabled, created_at) VALUES ({tenant}, 'old', FALSE, '{}', TRUE, 1)",
            receiver.url
        ),
        // A callback and an action request stored before endpoints existed.
        format!(
            "INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, \
             status, next_attempt_at, created_at, updated_at, action) VALUES ({}, {tenant}, \
             {event}, x'01', 'msg_old', x'7b7d', 'suspended', 1, 1, 1, 'callback')",
            blob(uuid::Uuid::now_v7())
        ),
        format!(
            "INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, \
             status, next_attempt_at, created_at, updated_at, action, connector) VALUES ({}, \
             {tenant}, {event}, x'01', 'old:open_case', x'', 'succeeded', 1, 1, 1, 'open_case', \
             'cases')",
            blob(uuid::Uuid::now_v7())
        ),
    ];
    let statements: Vec<String> = statements
        .into_iter()
        .map(|sql| match backend {
            Backend::Sqlite => sql,
            Backend::Postgres => sql
                .replace("x'01'", "'\\x01'::bytea")
                .replace("x'7b7d'", "'\\x7b7d'::bytea")
                .replace("x''", "''::bytea"),
        })
        .collect();
    before_endpoints(&db, &statements).await;

    // The current binary migrates: the URL, its disabled state and the callback are the
    // `default` endpoint's, the action request no endpoint's.
    let created = db.cli(&[
        "tenant",
        "key",
        "create",
        "--tenant",
        &tenant_id.to_string(),
        "--scope",
        "admin",
        "--json",
    ]);
    let key: Value = serde_json::from_str(&created).unwrap();
    let old = Tenant {
        id: tenant_id.to_string(),
        api_key: key["api_key"].as_str().unwrap().to_owned(),
        signing_secret: String::new(),
        webhook_secret: String::new(),
    };
    let server = Server::start(&db, &MANUAL_WORKER);
    let endpoints = server.get(&old, "/v1/endpoints").await.json();
    assert_eq!(
        endpoints["data"].as_array().unwrap().len(),
        1,
        "{endpoints}"
    );
    let default = &endpoints["data"][0];
    assert_eq!(default["name"], "default");
    assert_eq!(default["id"], tenant_id.to_string());
    assert_eq!(default["url"], receiver.url.as_str());
    assert_eq!(default["enabled"], false, "a 410's disabling survives");
    assert_eq!(default["secret"], "tenant");
    let callbacks = server
        .get(&old, "/v1/deliveries?endpoint=default")
        .await
        .json();
    assert_eq!(
        callbacks["data"].as_array().unwrap().len(),
        1,
        "{callbacks}"
    );
    assert_eq!(callbacks["data"][0]["webhook_id"], "msg_old");
    let all = server.get(&old, "/v1/deliveries").await.json();
    let request = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["action"] == "open_case")
        .unwrap();
    assert!(request.get("endpoint").is_none(), "{request}");
    assert_eq!(
        db.text("SELECT url FROM endpoints").await,
        receiver.url,
        "no data lost"
    );
}

/// Deliveries stored before their signal's unique index led with its observation time get it
/// when the index changes: a callback its event's, a way back's request its event id's own
/// milliseconds, so a signal sent again after the upgrade still finds its callback.
async fn deliveries_stored_before_the_time_ordered_index_take_their_signals_time(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant_id = uuid::Uuid::now_v7();
    let (event_id, way_back_id) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    // A signal's key is a digest, never its event's id (a way back's is).
    let signal_key = uuid::Uuid::new_v4();
    let (blob, bytes) = (|id| db.uuid_sql(id), |id| db.bytes_sql(id));
    let (tenant, event, way_back) = (blob(tenant_id), blob(event_id), blob(way_back_id));
    let statements = [
        format!(
            "INSERT INTO tenants (id, name, inbound_signature_required, created_at) \
             VALUES ({tenant}, 'old', FALSE, 1)"
        ),
        format!(
            "INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, \
             attributes, metadata, decision, playbook_version, rule, actions, created_at, \
             signal_key) VALUES ({event}, {tenant}, 'sim_swap', {s}, 1700000000123, '{{}}', \
             '{{}}', 'deny', 1, 'r', 'callback', 1700000000200, {s})",
            s = bytes(signal_key),
        ),
        format!(
            "INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, \
             status, next_attempt_at, created_at, updated_at, action, endpoint_id) VALUES ({}, \
             {tenant}, {event}, {}, 'msg_old', {}, 'succeeded', 1, 1, 1, 'callback', {tenant})",
            blob(uuid::Uuid::now_v7()),
            bytes(signal_key),
            bytes(event_id),
        ),
        format!(
            "INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, \
             status, next_attempt_at, created_at, updated_at, action, connector) VALUES ({}, \
             {tenant}, {way_back}, {}, 'old:unlock_account', {}, 'succeeded', 1, 1, 1, \
             'unlock_account', 'idp')",
            blob(uuid::Uuid::now_v7()),
            bytes(way_back_id),
            bytes(way_back_id),
        ),
    ];
    migrated_before(&db, ("0028", "0030"), &statements).await;
    // The current binary migrates.
    db.cli(&["tenant", "list", "--json"]);
    let (secs, _) = way_back_id.get_timestamp().unwrap().to_unix();
    let way_back_ms = db
        .scalar("SELECT observed_at FROM deliveries WHERE action = 'unlock_account'")
        .await;
    assert_eq!(way_back_ms / 1000, i64::try_from(secs).unwrap());
    assert_eq!(
        db.scalar("SELECT observed_at FROM deliveries WHERE action = 'callback'")
            .await,
        1_700_000_000_123
    );
}

on_both_backends!(
    deliveries_stored_before_the_time_ordered_index_take_their_signals_time,
    a_tenants_callback_url_becomes_its_default_endpoint_with_its_deliveries,
    the_console_shows_no_token_from_a_url_and_each_endpoints_deliveries,
    each_matching_endpoint_gets_one_delivery_per_decision,
    each_endpoint_gets_one_delivery_through_a_crash_before_the_inline_attempts,
    a_410_disables_only_its_own_endpoint,
);
