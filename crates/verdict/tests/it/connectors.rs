//! Connectors are managed with an admin key (API) or the CLI, their credentials sealed at rest
//! and never shown again, and every input a tenant gives them is bounded.

use crate::common::{Backend, Reply, Server, Tenant, TestDb, assert_problem};
use serde_json::{Value, json};

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

async fn put(server: &Server, tenant: &Tenant, name: &str, body: Value) -> Reply {
    call(
        server,
        tenant,
        reqwest::Method::PUT,
        &format!("/v1/connectors/{name}"),
        Some(body),
    )
    .await
}

/// Asserts `reply` is the problem a connector over the tenant's limit gets.
fn assert_over_limit(reply: &Reply, what: &str) {
    let problem = assert_problem(reply, 422, what);
    assert!(
        problem["type"]
            .as_str()
            .unwrap()
            .ends_with("connector-limit-exceeded"),
        "{what}: {problem}"
    );
}

const TOKEN: &str = "scim-bearer-token-d41d8cd98f00b204e9800998ecf8427e";

async fn connectors_are_managed_by_api_and_never_show_their_credentials(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);

    let created = put(
        &server,
        &tenant,
        "cases",
        json!({"kind": "http", "url": "http://127.0.0.1:9/actions"}),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    let secret = created.json()["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert_eq!(created.json()["guarantee"], "exactly_once");

    let replaced = put(
        &server,
        &tenant,
        "cases",
        json!({"kind": "http", "url": "http://127.0.0.1:9/v2", "guarantee": "at_most_once"}),
    )
    .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    assert!(
        replaced.json().get("secret").is_none(),
        "a replaced HTTP connector keeps its secret and does not show it"
    );
    assert_eq!(replaced.json()["url"], "http://127.0.0.1:9/v2");
    assert_eq!(replaced.json()["guarantee"], "at_most_once");

    let rotated = put(
        &server,
        &tenant,
        "cases",
        json!({"kind": "http", "url": "http://127.0.0.1:9/v2", "rotate_secret": true}),
    )
    .await;
    assert_eq!(rotated.status, 200, "{}", rotated.text());
    let new_secret = rotated.json()["secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, secret, "a rotation makes a new secret");

    let scim = put(
        &server,
        &tenant,
        "idp",
        json!({"kind": "scim", "url": "http://127.0.0.1:9/scim/v2", "token": TOKEN,
               "match": "externalId"}),
    )
    .await;
    assert_eq!(scim.status, 201, "{}", scim.text());
    assert!(scim.json().get("secret").is_none());
    assert!(scim.json().get("token").is_none());
    // Replacing it without a token keeps the one it has.
    let kept = put(
        &server,
        &tenant,
        "idp",
        json!({"kind": "scim", "url": "http://127.0.0.1:9/scim/v2"}),
    )
    .await;
    assert_eq!(kept.status, 200, "{}", kept.text());
    assert_eq!(kept.json()["match"], "userName");

    let list = call(
        &server,
        &tenant,
        reqwest::Method::GET,
        "/v1/connectors",
        None,
    )
    .await;
    assert_eq!(list.status, 200, "{}", list.text());
    let listed = list.json();
    let names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cases", "idp"]);
    for shown in [list.text().into_owned(), {
        let one = call(
            &server,
            &tenant,
            reqwest::Method::GET,
            "/v1/connectors/idp",
            None,
        )
        .await;
        assert_eq!(one.status, 200);
        one.text().into_owned()
    }] {
        for credential in [&secret, &new_secret, TOKEN] {
            assert!(!shown.contains(credential), "{shown}");
        }
        assert!(!shown.contains("\"secret\"") && !shown.contains("\"token\""));
    }

    // At rest: sealed, so neither the secret's bytes nor the token appear in the database.
    let dump = db.dump();
    let haystack = String::from_utf8_lossy(&dump);
    for credential in [&secret, &new_secret, TOKEN] {
        assert!(
            !haystack.contains(credential),
            "{credential} is stored in the clear"
        );
    }
    assert!(!server.logs().contains(TOKEN), "the token reached the logs");
    assert!(
        !server.logs().contains(&new_secret),
        "the secret reached the logs"
    );

    let gone = call(
        &server,
        &tenant,
        reqwest::Method::DELETE,
        "/v1/connectors/idp",
        None,
    )
    .await;
    assert_eq!(gone.status, 204, "{}", gone.text());
    let again = call(
        &server,
        &tenant,
        reqwest::Method::DELETE,
        "/v1/connectors/idp",
        None,
    )
    .await;
    assert_problem(&again, 404, "deleting it twice");
    let missing = call(
        &server,
        &tenant,
        reqwest::Method::GET,
        "/v1/connectors/idp",
        None,
    )
    .await;
    assert_problem(&missing, 404, "a deleted connector");
}

async fn every_connector_input_is_bounded(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let http = json!({"kind": "http", "url": "http://127.0.0.1:9/a"});

    let long_url = format!("http://127.0.0.1:9/{}", "a".repeat(2048));
    let cases = [
        ("Bad-Name", http.clone(), "a name with capitals"),
        (&"n".repeat(65)[..], http.clone(), "a name of 65 characters"),
        (
            "x",
            json!({"kind": "http", "url": long_url}),
            "a URL over 2048 bytes",
        ),
        (
            "x",
            json!({"kind": "http", "url": "http://169.254.169.254/latest"}),
            "a cloud metadata URL",
        ),
        (
            "x",
            json!({"kind": "http", "url": "ftp://127.0.0.1/a"}),
            "a URL that is not http(s)",
        ),
        (
            "x",
            json!({"kind": "scim", "url": "http://127.0.0.1:9/scim"}),
            "a new SCIM connector without a token",
        ),
        (
            "x",
            json!({"kind": "http", "url": "http://127.0.0.1:9/a?token=s3cret"}),
            "a URL with a query",
        ),
        (
            "x",
            json!({"kind": "scim", "url": "http://user:pw@127.0.0.1:9/scim", "token": "t"}),
            "a URL with a user and password",
        ),
        (
            "x",
            json!({"kind": "scim", "url": "http://127.0.0.1:9/scim", "token": "t".repeat(4097)}),
            "a token over 4096 bytes",
        ),
        (
            "x",
            json!({"kind": "scim", "url": "http://127.0.0.1:9/scim", "token": "a b"}),
            "a token with a space",
        ),
        (
            "x",
            json!({"kind": "http", "url": "http://127.0.0.1:9/a", "token": "t"}),
            "a token for an HTTP connector",
        ),
        (
            "x",
            json!({"kind": "smtp", "url": "http://127.0.0.1:9/a"}),
            "an unknown kind",
        ),
        (
            "x",
            json!({"kind": "http", "url": "http://127.0.0.1:9/a", "extra": 1}),
            "an unknown field",
        ),
    ];
    for (name, body, what) in cases {
        let reply = put(&server, &tenant, name, body).await;
        let problem = assert_problem(&reply, 400, what);
        assert!(problem["detail"].is_string(), "{what}: {problem}");
    }

    // At most 32 connectors a tenant; the 33rd is refused, a replacement still goes through.
    for n in 0..32 {
        let reply = put(&server, &tenant, &format!("c{n}"), http.clone()).await;
        assert_eq!(reply.status, 201, "connector {n}: {}", reply.text());
    }
    let over = put(&server, &tenant, "c32", http.clone()).await;
    assert_over_limit(&over, "a 33rd connector");
    let replaced = put(&server, &tenant, "c7", http.clone()).await;
    assert_eq!(replaced.status, 200, "{}", replaced.text());
    assert_eq!(db.scalar("SELECT COUNT(*) FROM connectors").await, 32);
}

/// Sends `requests` together, each as soon as all are ready, and returns their replies.
async fn all_at_once(requests: impl Iterator<Item = reqwest::RequestBuilder>) -> Vec<Reply> {
    let requests: Vec<_> = requests.collect();
    let ready = std::sync::Arc::new(tokio::sync::Barrier::new(requests.len()));
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

async fn concurrent_creations_at_the_limit_let_exactly_one_through(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let http = json!({"kind": "http", "url": "http://127.0.0.1:9/a"});
    for n in 0..31 {
        let reply = put(&server, &tenant, &format!("c{n}"), http.clone()).await;
        assert_eq!(reply.status, 201, "connector {n}: {}", reply.text());
    }

    // Eight new names at once for the one place left: each request checks the count and
    // inserts, so without the two being one step several would see 31 and go in. Eight
    // concurrent reads first leave eight open connections (the client's and the server's
    // database pool's), so the puts arrive together rather than each behind a connect.
    let authed = |method, path: &str| {
        server
            .client
            .request(method, format!("{}{path}", server.base))
            .bearer_auth(&tenant.api_key)
    };
    let reads = (0..8).map(|_| authed(reqwest::Method::GET, "/v1/connectors"));
    for read in all_at_once(reads).await {
        assert_eq!(read.status, 200, "{}", read.text());
    }
    let puts = (0..8).map(|n| authed(reqwest::Method::PUT, &format!("/v1/connectors/new{n}")));
    let replies = all_at_once(puts.map(|req| req.json(&http))).await;
    let created = replies.iter().filter(|r| r.status == 201).count();
    assert_eq!(created, 1, "one of eight concurrent creations goes in");
    for over in replies.iter().filter(|r| r.status != 201) {
        assert_over_limit(over, "a creation over the limit");
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM connectors").await, 32);
}

async fn only_an_admin_key_sees_its_own_tenants_connectors(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let other = db.tenant(&[]);
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let body = json!({"kind": "http", "url": "http://127.0.0.1:9/a"});
    assert_eq!(
        put(&server, &tenant, "cases", body.clone()).await.status,
        201
    );

    let forbidden = put(&server, &reader, "mine", body.clone()).await;
    assert_problem(&forbidden, 403, "a read key setting a connector");
    let listed = call(
        &server,
        &reader,
        reqwest::Method::GET,
        "/v1/connectors",
        None,
    )
    .await;
    assert_problem(&listed, 403, "a read key listing connectors");

    let theirs = call(
        &server,
        &other,
        reqwest::Method::GET,
        "/v1/connectors/cases",
        None,
    )
    .await;
    assert_problem(&theirs, 404, "another tenant's connector");
    let deleted = call(
        &server,
        &other,
        reqwest::Method::DELETE,
        "/v1/connectors/cases",
        None,
    )
    .await;
    assert_problem(&deleted, 404, "deleting another tenant's connector");
    let list = call(
        &server,
        &other,
        reqwest::Method::GET,
        "/v1/connectors",
        None,
    )
    .await;
    assert_eq!(list.json()["data"], json!([]));
}

async fn the_cli_prints_a_new_secret_once_and_reads_a_token_from_a_file(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let set = |extra: &[&str]| {
        let mut args = vec!["connector", "set", "--tenant", &tenant.id];
        args.extend_from_slice(extra);
        db.cli(&args)
    };
    let out: Value = serde_json::from_str(&set(&[
        "--name",
        "siem",
        "--kind",
        "http",
        "--url",
        "http://127.0.0.1:9/siem",
        "--json",
    ]))
    .unwrap();
    let secret = out["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{out}");
    let again = set(&[
        "--name",
        "siem",
        "--kind",
        "http",
        "--url",
        "http://127.0.0.1:9/siem",
    ]);
    assert!(
        again.contains("replaced") && !again.contains("whsec_"),
        "{again}"
    );

    let token_file = db.dir().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    set(&[
        "--name",
        "idp",
        "--kind",
        "scim",
        "--url",
        "http://127.0.0.1:9/scim/v2",
        "--token-file",
        token_file.to_str().unwrap(),
        "--match",
        "externalId",
    ]);
    let list = db.cli(&["connector", "list", "--tenant", &tenant.id, "--json"]);
    let list: Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list[0]["name"], "idp");
    assert_eq!(list[0]["match"], "externalId");
    assert_eq!(list[1]["name"], "siem");
    let shown = db.cli(&["connector", "show", "--tenant", &tenant.id, "--name", "idp"]);
    assert!(
        !shown.contains(TOKEN) && !shown.contains(&secret),
        "{shown}"
    );

    let refused = db.cli_output(
        &[
            "connector",
            "set",
            "--tenant",
            &tenant.id,
            "--name",
            "x",
            "--kind",
            "scim",
            "--url",
            "http://127.0.0.1:9/scim",
        ],
        &[],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("needs a bearer token"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    db.cli(&[
        "connector",
        "delete",
        "--tenant",
        &tenant.id,
        "--name",
        "idp",
    ]);
    assert_eq!(db.scalar("SELECT COUNT(*) FROM connectors").await, 1);
}

async fn put_playbook(server: &Server, tenant: &Tenant, source: &str) -> Reply {
    Reply::from(
        server
            .client
            .put(format!("{}/v1/playbook", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body(source.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

const RULES: &str = r#"
[[rule]]
name = "deny_swaps"
when = { type = ["sim_swap"] }
decision = "deny"
actions = ["lock_account", "open_case", "callback"]
"#;

async fn a_playbook_binds_actions_only_to_connectors_the_tenant_has(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")]);
    let bound = format!("{RULES}\n[actions.lock_account]\nconnector = \"idp\"\n");

    let refused = put_playbook(&server, &tenant, &bound).await;
    let problem = assert_problem(&refused, 400, "a binding to a connector the tenant lacks");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("line 9") && detail.contains("no connector named `idp`"),
        "{detail}"
    );
    assert_eq!(db.scalar("SELECT COUNT(*) FROM playbooks").await, 0);

    let scim = json!({"kind": "scim", "url": "http://127.0.0.1:9/scim/v2", "token": TOKEN});
    assert_eq!(put(&server, &tenant, "idp", scim).await.status, 201);
    let http = json!({"kind": "http", "url": "http://127.0.0.1:9/cases"});
    assert_eq!(put(&server, &tenant, "cases", http).await.status, 201);
    let accepted = put_playbook(
        &server,
        &tenant,
        &format!("{bound}\n[actions.open_case]\nconnector = \"cases\"\n"),
    )
    .await;
    assert!((200..300).contains(&accepted.status), "{}", accepted.text());

    for (extra, what, says) in [
        (
            "[actions.open_case]\nconnector = \"idp\"",
            "a case opened through a SCIM connector",
            "can lock accounts only",
        ),
        (
            "[actions.callback]\nconnector = \"cases\"",
            "the callback bound to a connector",
            "binds to no connector",
        ),
        (
            "[actions.suspend_okta_user]\nconnector = \"idp\"",
            "a custom action through a SCIM connector",
            "can lock accounts only",
        ),
        (
            "[actions.Suspend-Okta]\nconnector = \"cases\"",
            "a name that is no action's",
            "Suspend-Okta",
        ),
        (
            "[actions.open_case]\nconnector = \"Cases!\"",
            "a name that is no connector name",
            "connector name",
        ),
    ] {
        let reply = put_playbook(&server, &tenant, &format!("{RULES}\n{extra}\n")).await;
        let problem = assert_problem(&reply, 400, what);
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{what}: {detail}");
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM playbooks").await, 1);
}

on_both_backends!(
    a_playbook_binds_actions_only_to_connectors_the_tenant_has,
    concurrent_creations_at_the_limit_let_exactly_one_through,
    connectors_are_managed_by_api_and_never_show_their_credentials,
    every_connector_input_is_bounded,
    only_an_admin_key_sees_its_own_tenants_connectors,
    the_cli_prints_a_new_secret_once_and_reads_a_token_from_a_file,
);
