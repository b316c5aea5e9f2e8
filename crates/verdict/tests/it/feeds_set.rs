//! Security Event Tokens pushed per RFC 8935 to `POST /v1/sets`: verified against the tenant's
//! transmitter, decided once per (`iss`, `jti`), refused in RFC 8935's form with nothing
//! claimed. Every token is made by PyJWT with `cryptography` (`common/set_signer.py`).

use std::time::Duration;

use crate::common;
use crate::common::receiver::Receiver;
use crate::common::sets::{
    self, AUDIENCE, CREDENTIAL_COMPROMISE, ISSUER, JwksServer, SESSION_REVOKED, Transmitter,
    claims, email, phone, push, push_as,
};
use crate::common::{Backend, Reply, Server, Tenant, TestDb, now};
use serde_json::{Value, json};

const ALLOW_LOOPBACK: [(&str, &str); 1] = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")];

async fn claimed(db: &TestDb) -> (i64, i64) {
    (
        db.scalar("SELECT COUNT(*) FROM idempotency_keys").await,
        db.scalar("SELECT COUNT(*) FROM events").await,
    )
}

fn assert_accepted(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        202,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(reply.body.is_empty(), "{what}: 202 has an empty body");
}

/// Asserts an RFC 8935 error: the status, `err`, and a description that repeats nothing sent.
fn assert_refused(reply: &Reply, status: u16, err: &str, what: &str, sent: &[&str]) {
    assert_eq!(
        reply.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["err"], err, "{what}: {body}");
    let description = body["description"].as_str().unwrap();
    assert!(!description.is_empty(), "{what}");
    for value in sent {
        assert!(
            !description.contains(value),
            "{what}: {description} echoes {value}"
        );
    }
}

async fn sets_signed_with_rsa_and_ec_keys_are_accepted_once_each(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    sets::register_file(&db, &tenant, &transmitter, &["rsa-1", "ec-1"]);
    let server = Server::start(&db, &ALLOW_LOOPBACK);

    let by_rsa = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("alice@example.com")),
    );
    assert_accepted(&push(&server, &sender.api_key, &by_rsa).await, "RS256");
    assert_accepted(
        &push(&server, &sender.api_key, &by_rsa).await,
        "RS256 again",
    );
    assert_eq!(
        claimed(&db).await,
        (1, 1),
        "the same SET twice is one event"
    );

    let by_ec = transmitter.sign(
        "ec-1",
        &claims(CREDENTIAL_COMPROMISE, phone("+12065550100")),
    );
    assert_accepted(&push(&server, &sender.api_key, &by_ec).await, "ES256");
    assert_accepted(&push(&server, &sender.api_key, &by_ec).await, "ES256 again");
    assert_eq!(claimed(&db).await, (2, 2));

    // Decided by the default playbook as a breached credential, and marked as a SET.
    let events = server.get(&tenant, "/v1/events").await.json();
    let events = events["data"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    for event in events {
        assert_eq!(event["feed"], "set", "{event}");
        assert_eq!(event["type"], "credential_breach");
        assert_eq!(event["decision"], "step_up");
        assert_eq!(event["rule"], "breached_credential");
        assert_eq!(event["attributes"]["event_type"], CREDENTIAL_COMPROMISE);
        assert_eq!(event["metadata"]["set"]["iss"], ISSUER);
    }

    // One callback per SET, saying where it came from.
    let callbacks = receiver.received();
    assert_eq!(callbacks.len(), 2);
    for callback in &callbacks {
        let envelope = callback.json();
        assert_eq!(envelope["feed"], "set");
        assert_eq!(envelope["event_type"], "decision.credential_breach");
    }
    receiver.verify_all_with_python(&tenant.webhook_secret);

    // The tenant requires signed signals, so its general keys are refused here: the feed
    // takes the key made for it. The subject is the same account as a signal's.
    let again = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("alice@example.com")),
    );
    let general = push(&server, &tenant.api_key, &again).await;
    assert_eq!(general.status, 403, "{}", general.text());
    assert_eq!(general.json()["err"], "access_denied");
    assert_accepted(
        &push(&server, &sender.api_key, &again).await,
        "the feed's key",
    );
    let signal = format!(
        r#"{{"type":"credential_breach","subject":{{"account":"alice@example.com"}},"observed_at":"{}"}}"#,
        time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    );
    let decided = server.send(&tenant, None, &signal).await;
    assert_eq!(decided.status, 200);
    let hashes: Vec<Value> = server.get(&tenant, "/v1/events").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject_hash"].clone())
        .collect();
    assert_eq!(hashes[0], decided.json()["subject_hash"]);
    assert!(hashes[1..].contains(&decided.json()["subject_hash"]));

    // No raw identifier reached the database or the logs.
    let logs = server.logs();
    server.kill();
    let dump = db.dump();
    for needle in ["alice@example.com", "+12065550100", "2065550100"] {
        assert!(
            !dump.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "the database holds {needle}"
        );
        assert!(!logs.contains(needle), "the logs hold {needle}");
    }
}

async fn refused_sets_get_the_rfc8935_error_and_claim_nothing(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let sender = db.feed_key(&tenant, "set");
    let (_, reader) = db.issue_key(&tenant, "read");
    let transmitter = Transmitter::new(db.dir());
    sets::register_file(&db, &tenant, &transmitter, &["rsa-1", "ec-1"]);
    let server = Server::start(&db, &[]);
    let subject = "bob@example.com";
    let fresh = || claims(CREDENTIAL_COMPROMISE, email(subject));
    let with = |patch: Value| {
        let mut c = fresh();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };

    // A valid token whose payload was changed after signing.
    let valid = transmitter.sign("rsa-1", &fresh());
    let parts: Vec<&str> = valid.split('.').collect();
    let tampered_claims = with(json!({"sub_id": email("mallory@example.com")}));
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        b64.encode(tampered_claims.to_string()),
        parts[2]
    );
    let cases: Vec<(&str, String, &str)> = vec![
        ("tampered", tampered, "invalid_key"),
        (
            "issued 10 minutes ago",
            transmitter.sign("rsa-1", &with(json!({"iat": now() - 600}))),
            "invalid_request",
        ),
        (
            "expired",
            transmitter.sign("ec-1", &with(json!({"exp": now() - 3600}))),
            "invalid_request",
        ),
        (
            "issued in the future",
            transmitter.sign("ec-1", &with(json!({"iat": now() + 3600}))),
            "invalid_request",
        ),
        (
            "wrong issuer",
            transmitter.sign("rsa-1", &with(json!({"iss": "https://evil.example.com"}))),
            "invalid_issuer",
        ),
        (
            "wrong audience",
            transmitter.sign(
                "ec-1",
                &with(json!({"aud": "https://elsewhere.example.com"})),
            ),
            "invalid_audience",
        ),
        (
            "alg none",
            transmitter
                .sign_with(json!({"alg": "none", "kid": "rsa-1", "pem": null, "claims": fresh()})),
            "invalid_key",
        ),
        (
            "HMAC keyed with the public key",
            transmitter.sign_with(json!({"kid": "rsa-1", "claims": fresh(),
                "hmac_secret_file": transmitter.public_pem("rsa-1")})),
            "invalid_key",
        ),
        (
            "RS256 under the EC key's kid",
            transmitter.sign_with(json!({"alg": "RS256", "kid": "ec-1",
                "pem": transmitter.private_pem("rsa-1"), "claims": fresh()})),
            "invalid_key",
        ),
        (
            "unknown kid",
            transmitter.sign_with(json!({"alg": "RS256", "kid": "rsa-9",
                "pem": transmitter.private_pem("rsa-1"), "claims": fresh()})),
            "invalid_key",
        ),
        (
            "signed by another transmitter's key",
            Transmitter::new(db.dir()).sign("rsa-1", &fresh()),
            "invalid_key",
        ),
        (
            "not a JWT typ",
            transmitter.sign_with(
                json!({"alg": "RS256", "kid": "rsa-1", "typ": "at+jwt", "claims": fresh()}),
            ),
            "invalid_request",
        ),
        (
            "two events",
            transmitter.sign(
                "rsa-1",
                &with(json!({"events": {CREDENTIAL_COMPROMISE: {}, SESSION_REVOKED: {}}})),
            ),
            "invalid_request",
        ),
        (
            "no jti",
            transmitter.sign("rsa-1", &with(json!({"jti": null}))),
            "invalid_request",
        ),
        ("not a JWS", "hello".to_owned(), "invalid_request"),
    ];
    for (what, token, err) in &cases {
        let reply = push(&server, &sender.api_key, token).await;
        assert_refused(
            &reply,
            400,
            err,
            what,
            &[subject, "mallory", "evil.example.com"],
        );
    }

    let token = transmitter.sign("rsa-1", &fresh());
    let unauthenticated = push(&server, "vk_not_a_key", &token).await;
    assert_refused(
        &unauthenticated,
        401,
        "authentication_failed",
        "bad key",
        &[],
    );
    let forbidden = push(&server, &reader.api_key, &token).await;
    assert_refused(&forbidden, 403, "access_denied", "read key", &[]);
    let json_body = push_as(&server, &sender.api_key, "application/json", &token).await;
    assert_refused(&json_body, 415, "invalid_request", "content type", &[]);
    let huge = "a".repeat(70 * 1024);
    let too_large = push(&server, &sender.api_key, &huge).await;
    assert_refused(&too_large, 413, "invalid_request", "too large", &[]);

    assert_eq!(
        claimed(&db).await,
        (0, 0),
        "no refused SET claimed anything"
    );
    // The token refused with a read key is accepted with an ingest key afterwards.
    assert_accepted(
        &push(&server, &sender.api_key, &token).await,
        "then accepted",
    );
}

async fn a_jti_reused_with_another_token_is_refused(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    sets::register_file(&db, &tenant, &transmitter, &["rsa-1"]);
    let server = Server::start(&db, &[]);

    let first = claims(CREDENTIAL_COMPROMISE, email("carol@example.com"));
    let mut second = claims(CREDENTIAL_COMPROMISE, email("dave@example.com"));
    second["jti"] = first["jti"].clone();
    assert_accepted(
        &push(&server, &sender.api_key, &transmitter.sign("rsa-1", &first)).await,
        "first",
    );
    let reused = push(
        &server,
        &sender.api_key,
        &transmitter.sign("rsa-1", &second),
    )
    .await;
    assert_refused(
        &reused,
        400,
        "invalid_request",
        "reused jti",
        &["dave", "carol"],
    );
    assert!(
        reused.json()["description"]
            .as_str()
            .unwrap()
            .contains("jti")
    );
    assert_eq!(claimed(&db).await, (1, 1));

    // Another issuer's jti is another key: a second transmitter config is a second tenant.
    let other = db.tenant(&[]);
    sets::register_file(&db, &other, &transmitter, &["rsa-1"]);
    assert_accepted(
        &push(
            &server,
            &db.feed_key(&other, "set").api_key,
            &transmitter.sign("rsa-1", &second),
        )
        .await,
        "same jti, other tenant",
    );
}

async fn an_unmapped_event_type_is_recorded_as_ignored_until_the_playbook_maps_it(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    sets::register_file(&db, &tenant, &transmitter, &["ec-1"]);
    let server = Server::start(&db, &ALLOW_LOOPBACK);

    let revoked = transmitter.sign("ec-1", &claims(SESSION_REVOKED, phone("+12065550111")));
    assert_accepted(&push(&server, &sender.api_key, &revoked).await, "unmapped");
    assert_accepted(
        &push(&server, &sender.api_key, &revoked).await,
        "unmapped again",
    );
    assert_eq!(claimed(&db).await, (1, 1));
    let page = server.get(&tenant, "/v1/events").await.json();
    let event = &page["data"][0];
    assert_eq!(event["type"], "unmapped", "{event}");
    assert_eq!(event["decision"], "ignored");
    assert_eq!(event["feed"], "set");
    assert_eq!(event["actions"], json!([]));
    assert_eq!(event["attributes"]["event_type"], SESSION_REVOKED);
    let shown = server.event(&tenant, event["id"].as_str().unwrap()).await;
    assert_eq!(shown["deliveries"], json!([]));
    for table in [
        "account_locks",
        "cases",
        "alert_windows",
        "denies",
        "ledger_entries",
        "deliveries",
    ] {
        assert_eq!(
            db.count(table).await,
            0,
            "{table}: an ignored event does nothing"
        );
    }
    assert!(receiver.received().is_empty(), "no callback");
    // A playbook simulation passes over it: it decided nothing.
    let simulated = Reply::from(
        server
            .client
            .post(format!("{}/v1/playbook/simulate", server.base))
            .bearer_auth(&tenant.api_key)
            .header("content-type", "application/toml")
            .body("[[rule]]\nname = \"all\"\ndecision = \"deny\"\n")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        simulated.status,
        200,
        "{}",
        String::from_utf8_lossy(&simulated.body)
    );
    assert_eq!(simulated.json()["examined"], 0);

    // The playbook maps the event type: the next such SET is a decided SIM swap.
    db.set_playbook(
        &tenant,
        &format!(
            "[[rule]]\nname = \"revoked_is_a_swap\"\nwhen = {{ type = [\"sim_swap\"] }}\n\
             decision = \"deny\"\nactions = [\"lock_account\", \"callback\"]\n\n\
             [feeds]\nset_events = {{ \"{SESSION_REVOKED}\" = \"sim_swap\" }}\n"
        ),
    );
    let mapped = transmitter.sign("ec-1", &claims(SESSION_REVOKED, phone("+12065550111")));
    assert_accepted(&push(&server, &sender.api_key, &mapped).await, "mapped");
    let page = server.get(&tenant, "/v1/events").await.json();
    let decided = &page["data"][0];
    assert_eq!(decided["type"], "sim_swap");
    assert_eq!(decided["decision"], "deny");
    assert_eq!(decided["subject_hash"], event["subject_hash"]);
    assert_eq!(db.count("account_locks").await, 1);
    assert_eq!(receiver.received().len(), 1);
    assert_eq!(receiver.received()[0].json()["feed"], "set");
}

/// A playbook that maps `SESSION_REVOKED` to `signal_type` and denies it with a lock and a
/// callback.
fn mapping_revoked_to(signal_type: &str) -> String {
    format!(
        "[[rule]]\nname = \"revoked_is_a_{signal_type}\"\nwhen = {{ type = [\"{signal_type}\"] }}\n\
         decision = \"deny\"\nactions = [\"lock_account\", \"callback\"]\n\n\
         [feeds]\nset_events = {{ \"{SESSION_REVOKED}\" = \"{signal_type}\" }}\n"
    )
}

/// A playbook under which `SESSION_REVOKED` maps to nothing.
const LEAVING_REVOKED_UNMAPPED: &str =
    "[[rule]]\nname = \"allow_all\"\ndecision = \"allow\"\nactions = []\n";

/// Pushes a SET under playbook `first` to a server that dies right after the claim, publishes
/// playbook `then`, and pushes the same token to a new server until it is accepted (the dead
/// holder's lock lasts 1 s). Returns the one stored event.
async fn retried_after_a_crash_and_a_new_mapping(
    backend: Backend,
    first: &str,
    then: &str,
) -> (TestDb, Receiver, Value) {
    let owned = TestDb::new(backend).await;
    let db = &owned;
    let receiver = Receiver::start(vec![]).await;
    let tenant = &db.tenant(&["--callback-url", &receiver.url]);
    let sender = db.feed_key(tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    sets::register_file(db, tenant, &transmitter, &["ec-1"]);
    db.set_playbook(tenant, first);
    let lock = ("VERDICT_LOCK_TIMEOUT_SECS", "1");
    let doomed = Server::start(
        db,
        &[
            ALLOW_LOOPBACK[0],
            lock,
            (
                "FAILPOINTS",
                "act::before_commit=1*return(permanent);ingest::after_claim=return(abort)",
            ),
        ],
    );
    let token = transmitter.sign("ec-1", &claims(SESSION_REVOKED, phone("+12065550131")));
    doomed
        .post_expecting_crash(
            "/v1/sets",
            &sender.api_key,
            "application/secevent+jwt",
            &token,
        )
        .await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted after the claim"
    );
    assert_eq!(claimed(db).await, (1, 0), "the claim survived the crash");

    db.set_playbook(tenant, then);
    let server = Server::start(db, &[ALLOW_LOOPBACK[0], lock]);
    let reply = common::until_not_in_progress(|| push(&server, &sender.api_key, &token)).await;
    assert_accepted(&reply, "the retry after the lock expired");
    assert_accepted(&push(&server, &sender.api_key, &token).await, "once more");
    assert_eq!(claimed(db).await, (1, 1), "one key, one event");
    let event = server.get(tenant, "/v1/events").await.json()["data"][0].clone();
    assert_eq!(
        event["playbook_version"], 1,
        "the recorded decision's playbook: {event}"
    );
    (owned, receiver, event)
}

async fn a_set_retried_after_a_crash_stays_the_signal_it_was_decided_as_when_its_type_is_no_longer_mapped(
    backend: Backend,
) {
    let (db, receiver, event) = retried_after_a_crash_and_a_new_mapping(
        backend,
        &mapping_revoked_to("sim_swap"),
        LEAVING_REVOKED_UNMAPPED,
    )
    .await;
    assert_eq!(event["type"], "sim_swap", "{event}");
    assert_eq!(event["decision"], "deny");
    assert_eq!(event["rule"], "revoked_is_a_sim_swap");
    assert_eq!(db.count("account_locks").await, 1);
    assert_eq!(receiver.received().len(), 1, "its callback");
}

async fn a_set_retried_after_a_crash_stays_the_signal_it_was_decided_as_when_its_type_maps_elsewhere(
    backend: Backend,
) {
    let (db, receiver, event) = retried_after_a_crash_and_a_new_mapping(
        backend,
        &mapping_revoked_to("sim_swap"),
        &mapping_revoked_to("port_out"),
    )
    .await;
    assert_eq!(event["type"], "sim_swap", "{event}");
    assert_eq!(event["rule"], "revoked_is_a_sim_swap");
    assert_eq!(db.count("account_locks").await, 1);
    assert_eq!(receiver.received().len(), 1, "its callback");
    assert_eq!(
        receiver.received()[0].json()["event_type"],
        "decision.sim_swap"
    );
}

async fn a_set_retried_after_a_crash_stays_ignored_when_its_type_has_been_mapped_since(
    backend: Backend,
) {
    let (db, receiver, event) = retried_after_a_crash_and_a_new_mapping(
        backend,
        LEAVING_REVOKED_UNMAPPED,
        &mapping_revoked_to("sim_swap"),
    )
    .await;
    assert_eq!(event["type"], "unmapped", "{event}");
    assert_eq!(event["decision"], "ignored");
    assert_eq!(db.count("account_locks").await, 0, "nothing was decided");
    assert!(receiver.received().is_empty(), "no callback");
}

async fn a_set_retried_after_a_crash_stays_ignored_as_recorded_under_a_newer_playbook(
    backend: Backend,
) {
    let still_unmapped = "[[rule]]\nname = \"deny_all\"\ndecision = \"deny\"\nactions = []\n";
    let (db, receiver, event) =
        retried_after_a_crash_and_a_new_mapping(backend, LEAVING_REVOKED_UNMAPPED, still_unmapped)
            .await;
    assert_eq!(event["type"], "unmapped", "{event}");
    assert_eq!(event["decision"], "ignored");
    assert_eq!(db.count("account_locks").await, 0);
    assert!(receiver.received().is_empty(), "no callback");
}

/// Registers the tenant's transmitter with its keys at `url`.
fn set_jwks_url(db: &TestDb, tenant: &Tenant, url: &str) {
    db.cli(&[
        "tenant",
        "set-transmitter",
        "--tenant",
        &tenant.id,
        "--issuer",
        ISSUER,
        "--audience",
        AUDIENCE,
        "--jwks-url",
        url,
    ]);
}

async fn a_jwks_url_is_fetched_through_the_guard_and_refreshed_for_an_unknown_kid(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    let jwks = JwksServer::start(transmitter.jwks_of(&["rsa-1"])).await;

    // A link-local (cloud metadata) URL is refused when it is set.
    let refused = db.cli_output(
        &[
            "tenant",
            "set-transmitter",
            "--tenant",
            &tenant.id,
            "--issuer",
            ISSUER,
            "--audience",
            AUDIENCE,
            "--jwks-url",
            "http://169.254.169.254/jwks.json",
        ],
        &[],
    );
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("link-local"));
    set_jwks_url(&db, &tenant, &jwks.url);

    // A server that does not allow loopback destinations never fetches it.
    let guarded = Server::start(&db, &[]);
    let token = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("erin@example.com")),
    );
    let reply = push(&guarded, &sender.api_key, &token).await;
    assert_refused(&reply, 400, "invalid_key", "guarded", &[]);
    assert_eq!(
        jwks.fetches(),
        0,
        "the guard refused the loopback URL before any request"
    );
    guarded.kill();
    // A name that resolves to loopback is refused when it resolves, as a key problem (400)
    // the transmitter's registration must fix, not an outage to retry (503) for ever.
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let hostname = hostname.trim();
    let port = url::Url::parse(&jwks.url).unwrap().port().unwrap();
    let resolved: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(&(hostname, port))
        .unwrap()
        .collect();
    assert!(
        !resolved.is_empty() && resolved.iter().all(|a| a.ip().is_loopback()),
        "this test needs the machine's name to resolve to loopback: {resolved:?}"
    );
    set_jwks_url(&db, &tenant, &format!("http://{hostname}:{port}/jwks.json"));
    let guarded = Server::start(&db, &[]);
    let by_name = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("erin@example.com")),
    );
    let reply = push(&guarded, &sender.api_key, &by_name).await;
    assert_refused(
        &reply,
        400,
        "invalid_key",
        "a name resolving to loopback",
        &[],
    );
    assert_eq!(jwks.fetches(), 0, "nothing reached the loopback listener");
    guarded.kill();
    set_jwks_url(&db, &tenant, &jwks.url);

    // Every token is signed before the clock starts: the refresh interval is short.
    let another = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("erin@example.com")),
    );
    let by_ec = transmitter.sign(
        "ec-1",
        &claims(CREDENTIAL_COMPROMISE, email("erin@example.com")),
    );
    let unknown = transmitter.sign_with(json!({"alg": "RS256", "kid": "rsa-9",
        "pem": transmitter.private_pem("rsa-1"), "claims": claims(CREDENTIAL_COMPROMISE, email("erin@example.com"))}));
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("VERDICT_SET_JWKS_REFRESH_SECS", "3"),
            ("VERDICT_SET_MAX_AGE_SECS", "60"),
        ],
    );
    assert_accepted(&push(&server, &sender.api_key, &token).await, "fetched");
    assert_accepted(&push(&server, &sender.api_key, &another).await, "cached");
    assert_eq!(jwks.fetches(), 1, "the JWKS is cached");

    // The transmitter adds an EC key. A SET under it right away finds an unknown kid, and the
    // refresh is rate limited: no second fetch within the interval.
    jwks.replace(transmitter.jwks.clone());
    let too_soon = push(&server, &sender.api_key, &by_ec).await;
    assert_refused(&too_soon, 400, "invalid_key", "unknown kid", &[]);
    assert_eq!(jwks.fetches(), 1);
    // After the interval the unknown kid fetches the JWKS again, once.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert_accepted(&push(&server, &sender.api_key, &by_ec).await, "refreshed");
    assert_eq!(jwks.fetches(), 2);
    // A flood of unknown kids costs at most one fetch per interval.
    for _ in 0..5 {
        let reply = push(&server, &sender.api_key, &unknown).await;
        assert_refused(&reply, 400, "invalid_key", "flood", &[]);
    }
    assert_eq!(jwks.fetches(), 2, "within the interval nothing is fetched");
    assert_eq!(claimed(&db).await, (3, 3));
}

async fn a_failing_jwks_url_is_fetched_once_per_backoff_whatever_the_set_rate(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    // Not a JWKS: every fetch of it fails.
    let jwks = JwksServer::start(json!({"not": "a jwks"})).await;
    set_jwks_url(&db, &tenant, &jwks.url);
    let tokens: Vec<String> = (0..40)
        .map(|i| {
            transmitter.sign(
                "rsa-1",
                &claims(CREDENTIAL_COMPROMISE, email(&format!("u{i}@example.com"))),
            )
        })
        .collect();
    let server = Server::start(
        &db,
        &[
            ("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1"),
            ("VERDICT_SET_JWKS_REFRESH_SECS", "2"),
            ("VERDICT_SET_MAX_AGE_SECS", "60"),
        ],
    );
    let started = std::time::Instant::now();
    for token in &tokens[..30] {
        let reply = push(&server, &sender.api_key, token).await;
        assert_refused(&reply, 400, "invalid_key", "a failing JWKS", &[]);
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "too slow to test"
    );
    assert_eq!(jwks.fetches(), 1, "30 SETs within the backoff fetched once");

    // Fixed, but the backoff doubled after a second failure: one fetch per wait.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let reply = push(&server, &sender.api_key, &tokens[30]).await;
    assert_refused(&reply, 400, "invalid_key", "still failing", &[]);
    assert_eq!(jwks.fetches(), 2);
    jwks.replace(transmitter.jwks_of(&["rsa-1"]));
    let reply = push(&server, &sender.api_key, &tokens[31]).await;
    assert_refused(
        &reply,
        400,
        "invalid_key",
        "within the doubled backoff",
        &[],
    );
    assert_eq!(jwks.fetches(), 2);
    tokio::time::sleep(Duration::from_millis(4100)).await;
    assert_accepted(
        &push(&server, &sender.api_key, &tokens[32]).await,
        "fetched again",
    );
    assert_accepted(&push(&server, &sender.api_key, &tokens[33]).await, "cached");
    assert_eq!(jwks.fetches(), 3);
}

async fn a_tenant_without_a_transmitter_refuses_sets_as_invalid_issuer(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let sender = db.feed_key(&tenant, "set");
    let transmitter = Transmitter::new(db.dir());
    let server = Server::start(&db, &[]);
    let token = transmitter.sign(
        "rsa-1",
        &claims(CREDENTIAL_COMPROMISE, email("f@example.com")),
    );
    let reply = push(&server, &sender.api_key, &token).await;
    assert_refused(&reply, 400, "invalid_issuer", "no transmitter", &[]);
    assert_eq!(claimed(&db).await, (0, 0));

    // Both feeds are in the OpenAPI document, with their own error forms.
    let doc = server.openapi().await.json();
    let sets = &doc["paths"]["/v1/sets"]["post"];
    assert!(sets["requestBody"]["content"]["application/secevent+jwt"].is_object());
    assert!(sets["responses"]["202"].is_object());
    let set_error = &sets["responses"]["400"]["content"]["application/json"]["schema"]["$ref"];
    assert_eq!(set_error, "#/components/schemas/SetErrorBody");
    let camara = &doc["paths"]["/v1/camara/sim-swap"]["post"];
    assert!(camara["requestBody"]["content"]["application/cloudevents+json"].is_object());
    assert!(camara["responses"]["204"].is_object());
    assert!(camara["responses"]["422"].is_object());
}

on_both_backends!(
    sets_signed_with_rsa_and_ec_keys_are_accepted_once_each,
    refused_sets_get_the_rfc8935_error_and_claim_nothing,
    a_jti_reused_with_another_token_is_refused,
    an_unmapped_event_type_is_recorded_as_ignored_until_the_playbook_maps_it,
    a_jwks_url_is_fetched_through_the_guard_and_refreshed_for_an_unknown_kid,
    a_failing_jwks_url_is_fetched_once_per_backoff_whatever_the_set_rate,
    a_tenant_without_a_transmitter_refuses_sets_as_invalid_issuer,
    a_set_retried_after_a_crash_stays_the_signal_it_was_decided_as_when_its_type_is_no_longer_mapped,
    a_set_retried_after_a_crash_stays_the_signal_it_was_decided_as_when_its_type_maps_elsewhere,
    a_set_retried_after_a_crash_stays_ignored_when_its_type_has_been_mapped_since,
    a_set_retried_after_a_crash_stays_ignored_as_recorded_under_a_newer_playbook,
);
