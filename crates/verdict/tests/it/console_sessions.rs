//! Console sessions over real HTTP: the cookie holds a random token the server stores only
//! hashed; a session ends by sign-out, by its key's revocation, and at its idle and absolute
//! ends; a sign-in posted from another site is refused; failed sign-ins are throttled; a page
//! shows only notices from its fixed set.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::common::console::{
    console_cookie, console_get, console_post, csrf_of, session_cookie, sign_in_with,
};
use crate::common::{Backend, Reply, Server, TestDb, new_key, sim_swap};

/// Whether a console page answered as signed in (200), rather than sending to sign in.
fn signed_in(reply: &Reply) -> bool {
    reply.status == 200
}

fn sent_to_sign_in(reply: &Reply) -> bool {
    reply.status == 303 && reply.header("location") == Some("/console/sign-in")
}

async fn an_old_cookie_is_refused_after_sign_out(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let cookie = console_cookie(&server, &tenant.api_key).await;
    let page = console_get(&server, &cookie, "/console/events").await;
    assert!(signed_in(&page), "{}", page.status);
    let csrf = csrf_of(&page.text()).expect("the page carries a CSRF token");
    let out = console_post(&server, &cookie, "/console/sign-out", &[("csrf", &csrf)]).await;
    assert_eq!(out.status, 303, "{}", out.text());
    // A copy of the cookie kept from before (as an attacker who read it would have).
    let again = console_get(&server, &cookie, "/console/events").await;
    assert!(
        sent_to_sign_in(&again),
        "the signed-out cookie still works: {} {}",
        again.status,
        again.text()
    );
    let forged = console_post(&server, &cookie, "/console/sign-out", &[("csrf", &csrf)]).await;
    assert!(sent_to_sign_in(&forged), "{}", forged.status);
}

async fn a_session_cookie_stops_working_when_its_key_is_revoked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let (key_id, reader) = db.issue_key(&tenant, "read");
    let server = Server::start(&db, &[]);
    let cookie = console_cookie(&server, &reader.api_key).await;
    let other = console_cookie(&server, &tenant.api_key).await;
    assert!(signed_in(
        &console_get(&server, &cookie, "/console/events").await
    ));
    db.cli(&[
        "tenant", "key", "revoke", "--tenant", &tenant.id, "--key-id", &key_id,
    ]);
    // Checked against the key on each request, so at once (no cache in between).
    let after = console_get(&server, &cookie, "/console/events").await;
    assert!(
        sent_to_sign_in(&after),
        "the revoked key's session still works: {} {}",
        after.status,
        after.text()
    );
    let again = sign_in_with(&server, &reader.api_key, &[]).await;
    assert_eq!(again.status, 401, "the revoked key signs in no more");
    assert!(
        signed_in(&console_get(&server, &other, "/console/events").await),
        "another key's session is untouched"
    );
}

async fn an_expired_session_is_refused_and_pruned(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_CONSOLE_SESSION_MAX_SECS", "2")]);
    let cookie = console_cookie(&server, &tenant.api_key).await;
    assert!(signed_in(
        &console_get(&server, &cookie, "/console/events").await
    ));
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let late = console_get(&server, &cookie, "/console/events").await;
    assert!(
        sent_to_sign_in(&late),
        "a session past its 2 s still works: {} {}",
        late.status,
        late.text()
    );
    let pruned: serde_json::Value = serde_json::from_str(&db.cli(&["prune"])).unwrap();
    assert_eq!(pruned["console_sessions"], 1, "{pruned}");
    assert_eq!(db.scalar("SELECT COUNT(*) FROM console_sessions").await, 0);
}

async fn an_unused_session_ends_after_its_idle_time_and_use_keeps_it(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[("VERDICT_CONSOLE_SESSION_IDLE_SECS", "4")]);
    let cookie = console_cookie(&server, &tenant.api_key).await;
    // Used every 2.5 s, it outlives its 4 s idle time.
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let used = console_get(&server, &cookie, "/console/events").await;
        assert!(signed_in(&used), "a session in use ended: {}", used.status);
    }
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let idle = console_get(&server, &cookie, "/console/events").await;
    assert!(
        sent_to_sign_in(&idle),
        "a session unused past its idle time still works: {}",
        idle.status
    );
}

async fn a_sign_in_posted_from_another_site_is_refused_and_sets_no_cookie(backend: Backend) {
    let db = TestDb::new(backend).await;
    // The attacker's own tenant, whose key the victim's browser would be signed in with.
    let attackers = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    for headers in [
        vec![("origin", "https://attacker.example")],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![
            ("origin", "https://attacker.example"),
            ("sec-fetch-site", "cross-site"),
        ],
    ] {
        let reply = sign_in_with(&server, &attackers.api_key, &headers).await;
        assert_eq!(reply.status, 403, "{headers:?}: {}", reply.text());
        assert_eq!(session_cookie(&reply), None, "{headers:?} set a cookie");
        assert!(
            reply.text().contains("another site"),
            "{headers:?}: {}",
            reply.text()
        );
    }
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM console_sessions").await,
        0,
        "no session was opened"
    );
    // The console's own form, as a browser posts it, signs in.
    let ours = sign_in_with(
        &server,
        &attackers.api_key,
        &[("origin", &server.base), ("sec-fetch-site", "same-origin")],
    )
    .await;
    assert_eq!(ours.status, 303, "{}", ours.text());
    assert!(session_cookie(&ours).is_some());
}

async fn wrong_sign_ins_past_the_budget_get_429_with_retry_after(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    // One key prefix: 10 failures, then refused.
    let prefix = &tenant.api_key[..11];
    for n in 0..10 {
        let wrong = format!("{prefix}wrong{n}");
        assert_eq!(sign_in_with(&server, &wrong, &[]).await.status, 401, "{n}");
    }
    let refused = sign_in_with(&server, &format!("{prefix}wrong10"), &[]).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=300).contains(&wait), "{wait}");
    // The address has failures left for other prefixes: 10 more, then refused, whatever key.
    for n in 0..10 {
        let wrong = format!("vk_{n:08}wrong");
        assert_eq!(sign_in_with(&server, &wrong, &[]).await.status, 401, "{n}");
    }
    let refused = sign_in_with(&server, "vk_99999999wrong", &[]).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.header("retry-after").is_some());
    let (_, reader) = db.issue_key(&tenant, "read");
    let right = sign_in_with(&server, &reader.api_key, &[]).await;
    assert_eq!(right.status, 429, "a throttled address is not heard at all");
    assert_eq!(session_cookie(&right), None);
}

async fn a_done_parameter_shows_only_notices_of_the_fixed_set(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let decided = server
        .send(&tenant, Some(&new_key()), &sim_swap("+15550107788"))
        .await;
    let event = decided.json()["event_id"].as_str().unwrap().to_owned();
    let cookie = console_cookie(&server, &tenant.api_key).await;
    let forged = [
        "<script>alert(1)</script>",
        "Your key has expired. Call +1 555 0100 to renew it.",
        "published%20or%20not",
    ];
    for page in [
        format!("/console/events/{event}"),
        "/console/deliveries".to_owned(),
        "/console/playbook".to_owned(),
    ] {
        for text in forged {
            let done: String = url::form_urlencoded::byte_serialize(text.as_bytes()).collect();
            let reply = console_get(&server, &cookie, &format!("{page}?done={done}")).await;
            assert_eq!(reply.status, 200, "{page}");
            let html = reply.text();
            assert!(
                !html.contains("class=\"notice\"")
                    && !html.contains("alert(1)")
                    && !html.contains("Call +1 555"),
                "{page} shows {text:?}: {html}"
            );
        }
    }
    let known = console_get(&server, &cookie, "/console/deliveries?done=redelivered").await;
    assert!(
        known
            .text()
            .contains("Redelivered: the new attempt is listed below."),
        "{}",
        known.text()
    );
}

async fn the_database_holds_only_the_sessions_digest_never_its_token_or_key(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let reply = sign_in_with(&server, &tenant.api_key, &[]).await;
    assert_eq!(reply.status, 303);
    let set_cookie = reply.header("set-cookie").unwrap().to_owned();
    for attribute in ["Path=/console", "HttpOnly", "SameSite=Strict"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    let cookie = session_cookie(&reply).unwrap();
    let token = cookie.strip_prefix("verdict_console=").unwrap();
    assert!(
        !token.contains(&tenant.api_key) && token.len() == 43,
        "the cookie holds a 32-byte token, not the key: {token}"
    );
    assert!(signed_in(
        &console_get(&server, &cookie, "/console/events").await
    ));
    let stored = match backend {
        Backend::Sqlite => {
            db.text("SELECT lower(hex(id_hash)) FROM console_sessions")
                .await
        }
        Backend::Postgres => {
            db.text("SELECT encode(id_hash, 'hex') FROM console_sessions")
                .await
        }
    };
    let digest: String = Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        stored, digest,
        "the session is stored as its token's SHA-256"
    );
    let dump = db.dump();
    for (secret, what) in [
        (token, "the session token"),
        (&tenant.api_key, "the API key"),
    ] {
        assert!(
            !dump.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{what} is in the database"
        );
    }
    assert!(
        !server.logs().contains(token),
        "the session token reached the logs"
    );
}

async fn a_key_keeps_its_newest_20_sessions(backend: Backend) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let mut cookies = Vec::new();
    for _ in 0..21 {
        cookies.push(console_cookie(&server, &tenant.api_key).await);
    }
    assert_eq!(db.scalar("SELECT COUNT(*) FROM console_sessions").await, 20);
    assert!(
        sent_to_sign_in(&console_get(&server, &cookies[0], "/console/events").await),
        "the oldest of 21 sessions is ended"
    );
    for cookie in &cookies[1..] {
        assert!(signed_in(
            &console_get(&server, cookie, "/console/events").await
        ));
    }
}

on_both_backends!(
    an_old_cookie_is_refused_after_sign_out,
    a_session_cookie_stops_working_when_its_key_is_revoked,
    an_expired_session_is_refused_and_pruned,
    an_unused_session_ends_after_its_idle_time_and_use_keeps_it,
    a_sign_in_posted_from_another_site_is_refused_and_sets_no_cookie,
    wrong_sign_ins_past_the_budget_get_429_with_retry_after,
    a_done_parameter_shows_only_notices_of_the_fixed_set,
    the_database_holds_only_the_sessions_digest_never_its_token_or_key,
    a_key_keeps_its_newest_20_sessions,
);
