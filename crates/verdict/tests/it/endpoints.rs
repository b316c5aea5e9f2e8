//! Callback endpoints are managed with an admin key (API) or the CLI, their secrets sealed at
//! rest and shown once, and every input a tenant gives them is bounded.

use serde_json::{Value, json};

use crate::common::{
    Backend, MANUAL_WORKER, Reply, Server, Tenant, TestDb, assert_problem, new_key, sim_swap,
};
use crate::console_subjects::Session;

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
    // Printed as text, the new secret is shown once; the tenant may come from the
    // environment.
    let env = [
        ("VERDICT_TENANT_ID", tenant.id.as_str()),
        ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "0"),
    ];
    let set = |extra: &[&'static str]| {
        let mut args = vec!["endpoint", "set", "--name", "pager", "--url", HOOK];
        args.extend_from_slice(extra);
        db.cli_output(&args, &env)
    };
    let guarded = set(&[]);
    assert!(!guarded.status.success(), "a loopback URL without the flag");
    let stderr = String::from_utf8_lossy(&guarded.stderr);
    assert!(stderr.contains("refused"), "{stderr}");
    let made = set(&["--allow-private-destinations", "--feed", "camara"]);
    let text = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    assert!(text.contains("endpoint pager created"), "{text}");
    assert!(text.contains("secret  whsec_"), "{text}");
    let again = set(&["--allow-private-destinations", "--disabled"]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("endpoint pager replaced") && !text.contains("whsec_"),
        "{text}"
    );
    let listed = db.cli_output(&["endpoint", "list"], &env);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains("pager") && text.contains("false") && text.contains("siem"),
        "{text}"
    );

    db.cli(&[
        "endpoint", "delete", "--tenant", &tenant.id, "--name", "siem",
    ]);
    assert_eq!(db.count("endpoints").await, 1);
    let missing = db.cli_output(&["endpoint", "show", "--name", "siem"], &env);
    assert!(!missing.status.success(), "a deleted endpoint");
}

async fn the_console_lists_endpoints_their_deliveries_and_disables_one(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&["--callback-url", HOOK]);
    let mut env = MANUAL_WORKER.to_vec();
    env.push(("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"));
    let server = Server::start(&db, &env);
    let siem = put(
        &server,
        &tenant,
        "siem",
        json!({"url": "http://127.0.0.1:9/siem?team=a&b=c", "filter": {"decisions": ["allow"], "feeds": ["set"]}}),
    )
    .await;
    assert_eq!(siem.status, 201, "{}", siem.text());
    let secret = siem.json()["secret_key"].as_str().unwrap().to_owned();
    // A SIM swap is denied: a callback to `default`, none to `siem`.
    let decided = server
        .send(&tenant, Some(&new_key()), &sim_swap("+15550104242"))
        .await;
    assert_eq!(decided.status, 200, "{}", decided.text());

    let admin = Session::sign_in(&server, &tenant.api_key).await;
    let page = admin.get("/console/endpoints").await;
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    for shown in [
        "href=\"/console/endpoints\" aria-current=\"page\"",
        "<code>default</code>",
        "<code>siem</code>",
        HOOK,
        // The URL without its query, which may carry the receiver's token.
        "<code>http://127.0.0.1:9/siem</code>",
        "every decision",
        "decisions: allow",
        "feeds: set",
        "webhook secrets",
        "its own secret",
        "href=\"/console/deliveries?endpoint=siem\"",
        "action=\"/console/endpoints/siem/disable\"",
    ] {
        assert!(html.contains(shown), "{shown} in {html}");
    }
    assert!(!html.contains("whsec_") && !html.contains(secret.trim_start_matches("whsec_")));
    assert!(!html.contains("team=a"), "no query on the page");

    // The deliveries page, filtered by endpoint.
    let all = admin.get("/console/deliveries?endpoint=default").await;
    assert_eq!(all.status, 200, "{}", all.text());
    assert!(all.text().contains("/console/events/"), "{}", all.text());
    assert!(all.text().contains("status=pending&amp;endpoint=default"));
    let none = admin.get("/console/deliveries?endpoint=siem").await;
    assert_eq!(none.status, 200);
    assert!(none.text().contains("No deliveries."), "{}", none.text());
    let bad = admin.get("/console/deliveries?endpoint=%3Cb%3E").await;
    assert_eq!(bad.status, 404, "{}", bad.text());
    assert!(!bad.text().contains("<b>"));

    // Disabled with the session's token and an admin key only.
    let no_token = admin
        .post_form("/console/endpoints/siem/disable", &[])
        .await;
    assert_eq!(no_token.status, 403, "{}", no_token.text());
    let (_, reader) = db.issue_key(&tenant, "read");
    let read = Session::sign_in(&server, &reader.api_key).await;
    let read_page = read.get("/console/endpoints").await.text().into_owned();
    assert!(read_page.contains("<code>siem</code>"), "{read_page}");
    assert!(
        !read_page.contains("/disable\""),
        "a read key gets no button"
    );
    let refused = read.post("/console/endpoints/siem/disable", &[]).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    let missing = admin.post("/console/endpoints/nope/disable", &[]).await;
    assert_eq!(missing.status, 404, "{}", missing.text());

    let disabled = admin.post("/console/endpoints/siem/disable", &[]).await;
    assert_eq!(disabled.status, 303, "{}", disabled.text());
    assert_eq!(
        disabled.header("location"),
        Some("/console/endpoints?done=endpoint-disabled")
    );
    let shown = call(&server, &tenant, reqwest::Method::GET, "/v1/endpoints/siem").await;
    let shown = shown.json();
    assert_eq!(shown["enabled"], false, "{shown}");
    assert_eq!(shown["filter"]["feeds"], json!(["set"]), "the rest kept");
    let after = admin
        .get("/console/endpoints?done=endpoint-disabled")
        .await
        .text()
        .into_owned();
    assert!(after.contains("Disabled: its callbacks are stored suspended"));
    assert!(after.contains("action=\"/console/endpoints/siem/enable\""));
    let enabled = admin.post("/console/endpoints/siem/enable", &[]).await;
    assert_eq!(enabled.status, 303, "{}", enabled.text());
    let shown = call(&server, &tenant, reqwest::Method::GET, "/v1/endpoints/siem").await;
    assert_eq!(shown.json()["enabled"], true);
    // Still its own secret, under the same id.
    let rows: Value = serde_json::from_str(&db.cli(&[
        "endpoint", "show", "--tenant", &tenant.id, "--name", "siem", "--json",
    ]))
    .unwrap();
    assert_eq!(rows["secret"], "own");
    assert_eq!(rows["id"], siem.json()["id"]);
}

on_both_backends!(
    endpoints_are_managed_by_api_and_show_their_secret_once,
    every_endpoint_input_is_bounded,
    only_an_admin_key_manages_endpoints,
    the_cli_sets_lists_and_deletes_endpoints,
    the_console_lists_endpoints_their_deliveries_and_disables_one,
);
