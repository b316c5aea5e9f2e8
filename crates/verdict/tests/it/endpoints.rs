//! Callback endpoints are managed with an admin key (API) or the CLI, their secrets sealed at
//! rest and shown once, and every input a tenant gives them is bounded.

use serde_json::{Value, json};

use crate::common::{Backend, Reply, Server, Tenant, TestDb, assert_problem};

const HOOK: &str = "http://127.0.0.1:9/hook";

/// Sends a request with `tenant`'s API key.
async fn call(server: &Server, tenant: &Tenant, method: reqwest::Method, path: &str) -> Reply {
    let req = server
        .client
        .request(method, format!("{}{path}", server.base))
        .bearer_auth(&tenant.api_key);
    Reply::from(req.send().await.unwrap()).await
}

/// `PUT /v1/endpoints/{name}` with `body` as it is.
async fn put_raw(server: &Server, tenant: &Tenant, name: &str, body: String) -> Reply {
    let req = server
        .client
        .put(format!("{}/v1/endpoints/{name}", server.base))
        .bearer_auth(&tenant.api_key)
        .header("content-type", "application/json")
        .body(body);
    Reply::from(req.send().await.unwrap()).await
}

async fn put(server: &Server, tenant: &Tenant, name: &str, body: Value) -> Reply {
    put_raw(server, tenant, name, body.to_string()).await
}

async fn endpoints_are_managed_by_api_and_show_their_secret_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--callback-url", HOOK]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);

    // The tenant's callback URL is its `default` endpoint, signed with its webhook secrets.
    let listed = call(&server, &tenant, reqwest::Method::GET, "/v1/endpoints").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let data = listed.json()["data"].clone();
    assert_eq!(data.as_array().unwrap().len(), 1, "{data}");
    assert_eq!(data[0]["name"], "default");
    assert_eq!(data[0]["url"], HOOK);
    assert_eq!(data[0]["secret"], "tenant");
    assert_eq!(data[0]["id"], tenant.id.as_str());

    let spec = json!({"url": HOOK, "filter": {"decisions": ["deny"], "feeds": ["signals", "set"]}});
    let created = put(&server, &tenant, "fraud-ops", spec.clone()).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let created = created.json();
    let secret = created["secret_key"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{created}");
    assert_eq!(created["secret"], "own");
    assert_eq!(created["filter"]["decisions"], json!(["deny"]));
    assert_eq!(created["filter"]["signal_types"], json!([]));

    // Replaced: same id, no secret shown; a rotation shows a new one.
    let replaced = put(
        &server,
        &tenant,
        "fraud-ops",
        json!({"url": HOOK, "enabled": false}),
    )
    .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    let replaced = replaced.json();
    assert_eq!(replaced["id"], created["id"]);
    assert!(replaced.get("secret_key").is_none(), "{replaced}");
    assert_eq!(replaced["enabled"], false);
    let rotated = put(
        &server,
        &tenant,
        "fraud-ops",
        json!({"url": HOOK, "rotate_secret": true}),
    )
    .await
    .json();
    let new_secret = rotated["secret_key"].as_str().unwrap();
    assert_ne!(new_secret, secret);

    let shown = call(
        &server,
        &tenant,
        reqwest::Method::GET,
        "/v1/endpoints/fraud-ops",
    )
    .await;
    assert_eq!(shown.status, 200);
    assert!(!shown.text().contains("whsec_"), "{}", shown.text());
    // No secret in the clear at rest either.
    assert!(
        !String::from_utf8_lossy(&db.dump()).contains(new_secret.trim_start_matches("whsec_")),
        "the endpoint's secret is stored only sealed"
    );

    let deleted = call(
        &server,
        &tenant,
        reqwest::Method::DELETE,
        "/v1/endpoints/fraud-ops",
    )
    .await;
    assert_eq!(deleted.status, 204);
    let gone = call(
        &server,
        &tenant,
        reqwest::Method::GET,
        "/v1/endpoints/fraud-ops",
    )
    .await;
    assert_problem(&gone, 404, "a deleted endpoint");
    let again = call(
        &server,
        &tenant,
        reqwest::Method::DELETE,
        "/v1/endpoints/fraud-ops",
    )
    .await;
    assert_problem(&again, 404, "deleted twice");
}

async fn every_endpoint_input_is_bounded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);

    let long_url = format!("http://127.0.0.1:9/{}", "a".repeat(2048));
    let cases: [(&str, String, u16); 7] = [
        (
            "a URL over 2048 bytes",
            json!({"url": long_url}).to_string(),
            400,
        ),
        (
            "a value named twice",
            json!({"url": HOOK, "filter": {"decisions": ["deny", "deny"]}}).to_string(),
            400,
        ),
        (
            "an unknown signal type",
            json!({"url": HOOK, "filter": {"signal_types": ["sms"]}}).to_string(),
            400,
        ),
        (
            "an unknown field",
            json!({"url": HOOK, "filters": {}}).to_string(),
            400,
        ),
        (
            "a URL that is no URL",
            json!({"url": "hooks"}).to_string(),
            400,
        ),
        ("not JSON", "{".to_owned(), 400),
        (
            "a body over 4096 bytes",
            json!({"url": HOOK, "pad": "x".repeat(4096)}).to_string(),
            413,
        ),
    ];
    for (what, body, status) in cases {
        let reply = put_raw(&server, &tenant, "ops", body).await;
        assert_problem(&reply, status, what);
    }
    let bad_name = put(&server, &tenant, "Ops", json!({"url": HOOK})).await;
    assert_problem(&bad_name, 400, "a name that is no slug");
    assert_eq!(db.count("endpoints").await, 0, "nothing refused was stored");

    // At most 16 endpoints; one that exists can still be replaced at the bound.
    for n in 0..16 {
        let reply = put(&server, &tenant, &format!("e{n}"), json!({"url": HOOK})).await;
        assert_eq!(reply.status, 201, "endpoint {n}: {}", reply.text());
    }
    let over = put(&server, &tenant, "e16", json!({"url": HOOK})).await;
    let problem = assert_problem(&over, 422, "the 17th endpoint");
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("endpoint-limit-exceeded"),
        "{problem}"
    );
    let replaced = put(
        &server,
        &tenant,
        "e3",
        json!({"url": HOOK, "enabled": false}),
    )
    .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    assert_eq!(db.count("endpoints").await, 16);
    // The tenant's callback URL counts against the bound too.
    let out = db.cli_output(
        &[
            "tenant",
            "set-callback",
            "--tenant",
            &tenant.id,
            "--url",
            HOOK,
        ],
        &[],
    );
    assert!(!out.status.success(), "a 17th endpoint through the CLI");
}

async fn only_an_admin_key_manages_endpoints(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--callback-url", HOOK]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let listed = call(&server, &reader, reqwest::Method::GET, "/v1/endpoints").await;
    assert_problem(&listed, 403, "a read key lists endpoints");
    let put = put(&server, &reader, "ops", json!({"url": HOOK})).await;
    assert_problem(&put, 403, "a read key sets an endpoint");
    // Another tenant's admin key sees only its own.
    let other = db.tenant(&[]);
    let theirs = call(
        &server,
        &other,
        reqwest::Method::GET,
        "/v1/endpoints/default",
    )
    .await;
    assert_problem(&theirs, 404, "another tenant's endpoint");
}

async fn the_cli_sets_lists_and_deletes_endpoints(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let set = db.cli(&[
        "endpoint",
        "set",
        "--tenant",
        &tenant.id,
        "--name",
        "siem",
        "--url",
        HOOK,
        "--decision",
        "deny",
        "--signal-type",
        "sim_swap",
        "--json",
    ]);
    let set: Value = serde_json::from_str(&set).unwrap();
    assert!(
        set["secret_key"].as_str().unwrap().starts_with("whsec_"),
        "{set}"
    );
    let list: Value =
        serde_json::from_str(&db.cli(&["endpoint", "list", "--tenant", &tenant.id, "--json"]))
            .unwrap();
    assert_eq!(list[0]["name"], "siem");
    assert_eq!(list[0]["filter"]["signal_types"], json!(["sim_swap"]));
    assert!(!list.to_string().contains("whsec_"), "{list}");
    let shown = db.cli(&["endpoint", "show", "--tenant", &tenant.id, "--name", "siem"]);
    assert!(shown.contains("types=sim_swap decisions=deny"), "{shown}");
    db.cli(&[
        "endpoint", "delete", "--tenant", &tenant.id, "--name", "siem",
    ]);
    assert_eq!(db.count("endpoints").await, 0);
}

on_both_backends!(
    endpoints_are_managed_by_api_and_show_their_secret_once,
    every_endpoint_input_is_bounded,
    only_an_admin_key_manages_endpoints,
    the_cli_sets_lists_and_deletes_endpoints,
);
