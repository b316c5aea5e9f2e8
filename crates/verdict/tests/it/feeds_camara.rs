//! CAMARA SIM Swap notifications at `POST /v1/camara/sim-swap`: the published example decided
//! once however often it is delivered, the subject of a 3-legged subscription from its
//! registration, lifecycle events acknowledged, and errors in CAMARA's shape.

use crate::common;
use crate::common::receiver::Receiver;
use crate::common::{Backend, Reply, Server, Tenant, TestDb};
use serde_json::{Value, json};

/// The `SWAPPED` example notification of the published CAMARA API definition
/// (camaraproject/SimSwap, `code/API_definitions/sim-swap-subscriptions.yaml`,
/// `components.examples.SWAPPED`), as a carrier sends it.
const PUBLISHED_EXAMPLE: &str = r#"{
  "id": "123655",
  "source": "supertelco.notificationSendServer12",
  "type": "org.camaraproject.sim-swap-subscriptions.v0.swapped",
  "specversion": "1.0",
  "datacontenttype": "application/json",
  "data": {
    "phoneNumber": "+123456788",
    "subscriptionId": "2ghy-55gg-7iup-yuo9"
  },
  "time": "2023-01-18T13:18:23.682Z"
}"#;

/// The `SUBSCRIPTION_ENDS` example of the same definition.
const SUBSCRIPTION_ENDED: &str = r#"{
  "id": "123658",
  "source": "supertelco.notificationSendServer12",
  "type": "org.camaraproject.sim-swap-subscriptions.v0.subscription-ended",
  "specversion": "1.0",
  "datacontenttype": "application/json",
  "data": {
    "phoneNumber": "+123456789",
    "terminationReason": "SUBSCRIPTION_EXPIRED",
    "subscriptionId": "2ghy-55gg-7iup-yuo9",
    "terminationDescription": "subscription expire time reached"
  },
  "time": "2023-01-19T13:18:23.682Z"
}"#;

const ALLOW_LOOPBACK: [(&str, &str); 1] = [("VERDICT_ALLOW_PRIVATE_DESTINATIONS", "1")];

async fn notify(server: &Server, bearer: &str, body: &str) -> Reply {
    notify_as(server, bearer, "application/cloudevents+json", body).await
}

async fn notify_as(server: &Server, bearer: &str, content_type: &str, body: &str) -> Reply {
    Reply::from(
        server
            .client
            .post(format!("{}/v1/camara/sim-swap", server.base))
            .bearer_auth(bearer)
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// A fresh swap notification: a new `id`, swapped `minutes` ago, with or without a phone.
fn swap(subscription: &str, phone: Option<&str>, minutes: i64) -> String {
    let time = (time::OffsetDateTime::now_utc() - time::Duration::minutes(minutes))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let mut data = json!({ "subscriptionId": subscription });
    if let Some(phone) = phone {
        data["phoneNumber"] = json!(phone);
    }
    json!({
        "id": uuid::Uuid::new_v4().to_string(),
        "source": "https://notifications.carrier.example",
        "type": "org.camaraproject.sim-swap-subscriptions.v0.swapped",
        "specversion": "1.0",
        "datacontenttype": "application/json",
        "time": time,
        "data": data,
    })
    .to_string()
}

fn assert_no_content(reply: &Reply, what: &str) {
    assert_eq!(
        reply.status,
        204,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    assert!(reply.body.is_empty());
}

fn assert_camara_error(reply: &Reply, status: u16, code: &str, what: &str) {
    assert_eq!(
        reply.status,
        status,
        "{what}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["status"], status, "{what}: {body}");
    assert_eq!(body["code"], code, "{what}: {body}");
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

async fn claimed(db: &TestDb) -> (i64, i64) {
    (
        db.scalar("SELECT COUNT(*) FROM idempotency_keys").await,
        db.scalar("SELECT COUNT(*) FROM events").await,
    )
}

async fn latest_event(server: &Server, tenant: &Tenant) -> Value {
    server.get(tenant, "/v1/events?limit=1").await.json()["data"][0].clone()
}

async fn the_published_example_delivered_twice_makes_one_decision(backend: Backend) {
    let db = TestDb::new(backend).await;
    let receiver = Receiver::start(vec![]).await;
    let tenant = db.tenant(&["--callback-url", &receiver.url]);
    let carrier = db.feed_key(&tenant, "camara");
    let server = Server::start(&db, &ALLOW_LOOPBACK);

    assert_no_content(
        &notify(&server, &carrier.api_key, PUBLISHED_EXAMPLE).await,
        "first",
    );
    assert_no_content(
        &notify(&server, &carrier.api_key, PUBLISHED_EXAMPLE).await,
        "again",
    );
    // Re-serialised (other member order, no whitespace): the same notification.
    let reordered: Value = serde_json::from_str(PUBLISHED_EXAMPLE).unwrap();
    assert_no_content(
        &notify(&server, &carrier.api_key, &reordered.to_string()).await,
        "re-serialised",
    );
    assert_eq!(claimed(&db).await, (1, 1), "one decision");

    let event = latest_event(&server, &tenant).await;
    assert_eq!(event["feed"], "camara", "{event}");
    assert_eq!(event["type"], "sim_swap");
    assert_eq!(event["observed_at"], "2023-01-18T13:18:23.682Z");
    // The swap is years old: the default playbook's 72-hour rule does not deny it.
    assert_eq!(event["decision"], "allow");
    assert_eq!(
        event["metadata"]["cloudevent"],
        json!({"source": "supertelco.notificationSendServer12", "id": "123655"})
    );
    let callbacks = receiver.received();
    assert_eq!(callbacks.len(), 1, "one callback");
    assert_eq!(callbacks[0].json()["feed"], "camara");
    assert_eq!(callbacks[0].json()["event_type"], "decision.sim_swap");

    // The same swap as a signal is the same subject.
    let signal = r#"{"type":"sim_swap","subject":{"phone":"+123456788"},"observed_at":"2023-01-18T13:18:23.682Z"}"#;
    let decided = server.send(&tenant, None, signal).await;
    assert_eq!(decided.json()["subject_hash"], event["subject_hash"]);

    // The same `source` and `id` with other content is refused.
    let mut changed = reordered.clone();
    changed["data"]["phoneNumber"] = json!("+123456799");
    let conflict = notify(&server, &carrier.api_key, &changed.to_string()).await;
    assert_camara_error(&conflict, 409, "ALREADY_EXISTS", "other content");

    // The phone number never reached the database.
    server.kill();
    let dump = db.dump();
    for needle in ["+123456788", "123456788", "2ghy-55gg-7iup-yuo9"] {
        assert!(
            !dump.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "the database holds {needle}"
        );
    }
}

async fn without_a_phone_number_the_registered_subscription_supplies_the_subject(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let carrier = db.feed_key(&tenant, "camara");
    let server = Server::start(&db, &[]);

    // Not registered yet: refused, nothing claimed.
    let unregistered = notify(&server, &carrier.api_key, &swap("sub-3legs", None, 5)).await;
    assert_camara_error(&unregistered, 422, "MISSING_IDENTIFIER", "unregistered");
    assert_eq!(claimed(&db).await, (0, 0));

    let refused = db.cli_output(
        &[
            "camara",
            "subscription",
            "add",
            "--tenant",
            &tenant.id,
            "--subscription-id",
            "sub-3legs",
            "--phone",
            "07700900123",
        ],
        &[],
    );
    assert!(!refused.status.success(), "a number that is not E.164");
    register(&db, &tenant, "sub-3legs", "+447700900777");

    let notification = swap("sub-3legs", None, 5);
    assert_no_content(
        &notify(&server, &carrier.api_key, &notification).await,
        "3-legged",
    );
    assert_no_content(
        &notify(&server, &carrier.api_key, &notification).await,
        "again",
    );
    assert_eq!(claimed(&db).await, (1, 1));
    let event = latest_event(&server, &tenant).await;
    assert_eq!(event["feed"], "camara");
    // A recent swap: the default playbook denies and locks.
    assert_eq!(event["decision"], "deny", "{event}");
    assert_eq!(db.count("account_locks").await, 1);

    // The subject is the registered phone's: a signal about it finds the lock.
    let signal = common::sim_swap("+447700900777");
    let decided = server.send(&tenant, None, &signal).await;
    assert_eq!(decided.json()["subject_hash"], event["subject_hash"]);
    assert_eq!(decided.json()["rule"], "subject_already_locked");

    // Another tenant's registration is not this tenant's.
    let other = db.tenant(&[]);
    let elsewhere = notify(
        &server,
        &db.feed_key(&other, "camara").api_key,
        &swap("sub-3legs", None, 5),
    )
    .await;
    assert_camara_error(&elsewhere, 422, "MISSING_IDENTIFIER", "other tenant");

    db.cli(&[
        "camara",
        "subscription",
        "remove",
        "--tenant",
        &tenant.id,
        "--subscription-id",
        "sub-3legs",
    ]);
    let removed = notify(&server, &carrier.api_key, &swap("sub-3legs", None, 5)).await;
    assert_camara_error(&removed, 422, "MISSING_IDENTIFIER", "removed");
}

/// Registers `subscription` for `phone` with the CLI (a new registration replaces the last).
/// Registers `phone` for `subscription` as an operator would keep it out of `ps`: on stdin.
fn register(db: &TestDb, tenant: &Tenant, subscription: &str, phone: &str) {
    db.cli_with_stdin(
        &[
            "camara",
            "subscription",
            "add",
            "--tenant",
            &tenant.id,
            "--subscription-id",
            subscription,
            "--phone",
            "-",
        ],
        &format!("{phone}\n"),
    );
}

async fn a_notification_retried_after_a_crash_keeps_the_subject_it_was_decided_for(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let carrier = db.feed_key(&tenant, "camara");
    register(&db, &tenant, "sub-moved", "+447700900781");
    let lock = ("VERDICT_LOCK_TIMEOUT_SECS", "1");
    let doomed = Server::start(
        &db,
        &[
            lock,
            (
                "FAILPOINTS",
                "act::before_commit=1*return(permanent);ingest::after_claim=return(abort)",
            ),
        ],
    );
    let notification = swap("sub-moved", None, 5);
    doomed
        .post_expecting_crash(
            "/v1/camara/sim-swap",
            &carrier.api_key,
            "application/cloudevents+json",
            &notification,
        )
        .await;
    assert!(
        doomed.wait_for_crash(),
        "the process aborted after the claim"
    );
    assert_eq!(claimed(&db).await, (1, 0), "the claim survived the crash");

    // The subscription now names another number; the retry is still about the first one.
    register(&db, &tenant, "sub-moved", "+447700900782");
    let server = Server::start(&db, &[lock]);
    let reply =
        common::until_not_in_progress(|| notify(&server, &carrier.api_key, &notification)).await;
    assert_no_content(&reply, "the retry after the lock expired");
    assert_eq!(claimed(&db).await, (1, 1));
    let event = latest_event(&server, &tenant).await;
    assert_eq!(db.count("account_locks").await, 1);
    let first = server
        .send(&tenant, None, &common::sim_swap("+447700900781"))
        .await;
    assert_eq!(
        first.json()["subject_hash"],
        event["subject_hash"],
        "{event}"
    );
    assert_eq!(first.json()["rule"], "subject_already_locked");
    let second = server
        .send(&tenant, None, &common::sim_swap("+447700900782"))
        .await;
    assert_ne!(second.json()["rule"], "subject_already_locked");
}

async fn lifecycle_events_are_acknowledged_and_errors_take_camaras_shape(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let carrier = db.feed_key(&tenant, "camara");
    let (_, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);

    assert_no_content(
        &notify(&server, &carrier.api_key, SUBSCRIPTION_ENDED).await,
        "subscription ended",
    );
    assert!(
        server
            .logged("CAMARA subscription lifecycle notification acknowledged")
            .await
    );

    let body = swap("sub-1", Some("+447700900555"), 1);
    assert_camara_error(
        &notify(&server, "vk_nope", &body).await,
        401,
        "UNAUTHENTICATED",
        "bad key",
    );
    assert_camara_error(
        &notify(&server, &reader.api_key, &body).await,
        403,
        "PERMISSION_DENIED",
        "read key",
    );
    assert_camara_error(
        &notify(&server, &carrier.api_key, "{not json").await,
        400,
        "INVALID_ARGUMENT",
        "not JSON",
    );
    let mut other_type: Value = serde_json::from_str(&body).unwrap();
    other_type["type"] =
        json!("org.camaraproject.device-roaming-status-subscriptions.v0.roaming-on");
    assert_camara_error(
        &notify(&server, &carrier.api_key, &other_type.to_string()).await,
        400,
        "INVALID_ARGUMENT",
        "another API's event",
    );
    let mut bad_phone: Value = serde_json::from_str(&body).unwrap();
    bad_phone["data"]["phoneNumber"] = json!("0044770090055");
    let refused = notify(&server, &carrier.api_key, &bad_phone.to_string()).await;
    assert_camara_error(&refused, 400, "INVALID_ARGUMENT", "not E.164");
    assert!(!String::from_utf8_lossy(&refused.body).contains("0044770090055"));
    assert_camara_error(
        &notify_as(&server, &carrier.api_key, "text/plain", &body).await,
        400,
        "INVALID_ARGUMENT",
        "media type",
    );
    assert_eq!(
        claimed(&db).await,
        (0, 0),
        "nothing refused claimed anything"
    );

    // A structured CloudEvent sent as application/json is accepted too.
    assert_no_content(
        &notify_as(&server, &carrier.api_key, "application/json", &body).await,
        "application/json",
    );
    assert_eq!(claimed(&db).await, (1, 1));
}

async fn a_tenant_requiring_signatures_takes_only_a_key_made_for_the_feed(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (_, ingest) = db.issue_key(&tenant, "ingest");
    let server = Server::start(&db, &[]);

    // Unsigned notifications under the tenant's general keys lock nobody.
    for (what, key) in [
        ("ingest key", &ingest.api_key),
        ("admin key", &tenant.api_key),
    ] {
        let refused = notify(&server, key, &swap("sub-1", Some("+447700900601"), 1)).await;
        assert_camara_error(&refused, 403, "PERMISSION_DENIED", what);
        assert!(
            refused.json()["message"]
                .as_str()
                .is_some_and(|m| m.contains("requires signed signals")),
            "{what}: {}",
            refused.text()
        );
    }
    assert_eq!(db.count("idempotency_keys").await, 0);
    assert_eq!(db.count("events").await, 0);

    // A key made for the feed is taken there, and nowhere else.
    let carrier = db.feed_key(&tenant, "camara");
    assert_no_content(
        &notify(
            &server,
            &carrier.api_key,
            &swap("sub-1", Some("+447700900601"), 1),
        )
        .await,
        "the feed's own key",
    );
    assert_eq!(db.count("events").await, 1);
    let signal = common::signed(
        server.client.post(format!("{}/v1/signals", server.base)),
        &carrier,
        Some(&common::new_key()),
        &common::sim_swap("+447700900602"),
        common::now(),
    );
    let elsewhere = Reply::from(signal.send().await.unwrap()).await;
    assert_eq!(elsewhere.status, 403, "{}", elsewhere.text());
    assert_eq!(
        elsewhere.json()["type"],
        "https://verdict.dev/problems/insufficient-scope"
    );
    assert_eq!(server.get(&carrier, "/v1/events").await.status, 403);
    let transmitter = db.feed_key(&tenant, "set");
    assert_camara_error(
        &notify(
            &server,
            &transmitter.api_key,
            &swap("sub-1", Some("+447700900603"), 1),
        )
        .await,
        403,
        "PERMISSION_DENIED",
        "the SET feed's key",
    );
    assert_eq!(db.count("events").await, 1);

    // A feed key is an ingest key of camara or set, nothing else.
    for args in [
        &["--scope", "admin", "--feed", "camara"][..],
        &["--scope", "ingest", "--feed", "signals"][..],
    ] {
        let mut all = vec!["tenant", "key", "create", "--tenant", tenant.id.as_str()];
        all.extend_from_slice(args);
        let out = db.cli_output(&all, &[]);
        assert!(!out.status.success(), "{args:?} made a key");
    }
    let over_api = common::post_json(
        &server,
        &tenant,
        "/v1/keys",
        json!({"scope": "read", "feed": "camara"}),
    )
    .await;
    assert_eq!(over_api.status, 400, "{}", over_api.text());

    // A tenant that takes unsigned signals takes its general ingest key here too.
    let unsigned = db.tenant(&["--no-inbound-signature"]);
    let (_, general) = db.issue_key(&unsigned, "ingest");
    assert_no_content(
        &notify(
            &server,
            &general.api_key,
            &swap("sub-2", Some("+447700900604"), 1),
        )
        .await,
        "a general key of a tenant without signatures",
    );
}

on_both_backends!(
    a_tenant_requiring_signatures_takes_only_a_key_made_for_the_feed,
    the_published_example_delivered_twice_makes_one_decision,
    without_a_phone_number_the_registered_subscription_supplies_the_subject,
    a_notification_retried_after_a_crash_keeps_the_subject_it_was_decided_for,
    lifecycle_events_are_acknowledged_and_errors_take_camaras_shape,
);
