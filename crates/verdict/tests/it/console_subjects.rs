//! The console's subjects page over real HTTP: a subject found by the phone number or account
//! id posted in a form, and the way back taken from it, by an operator signed in with a session
//! cookie as a browser would be. The identifiers never reach the server's log or the database.

use serde_json::{Value, json};

use crate::common::{
    Backend, Reply, Server, Tenant, TestDb, new_key, sim_swap, sim_swap_of_account,
};

const PHONE: &str = "+15550104477";
const ACCOUNT: &str = "acct-console-4f1d9e";

/// A signed-in console session: its cookie and the CSRF token its pages carry.
pub(crate) struct Session<'a> {
    server: &'a Server,
    cookie: String,
    pub(crate) csrf: String,
}

impl<'a> Session<'a> {
    /// Signs in with `api_key` through the sign-in form, then reads the session's CSRF token
    /// from the subjects page.
    pub(crate) async fn sign_in(server: &'a Server, api_key: &str) -> Session<'a> {
        let signed_in = server
            .client
            .post(format!("{}/console/sign-in", server.base))
            .header("content-type", FORM)
            .body(encoded(&[("api_key", api_key)]))
            .send()
            .await
            .unwrap();
        assert_eq!(signed_in.status(), 303, "signing in redirects");
        let cookie = signed_in
            .headers()
            .get("set-cookie")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap()
            .to_owned();
        let mut session = Session {
            server,
            cookie,
            csrf: String::new(),
        };
        let page = session.get("/console/subjects").await;
        assert_eq!(page.status, 200, "{}", page.text());
        session.csrf = hidden(&page.text(), "csrf").expect("the page carries a CSRF token");
        session
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        Reply::from(
            self.server
                .client
                .get(format!("{}{path}", self.server.base))
                .header("cookie", &self.cookie)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Posts exactly `fields` as a form.
    pub(crate) async fn post_form(&self, path: &str, fields: &[(&str, &str)]) -> Reply {
        Reply::from(
            self.server
                .client
                .post(format!("{}{path}", self.server.base))
                .header("cookie", &self.cookie)
                .header("content-type", FORM)
                .body(encoded(fields))
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Posts `fields` and this session's CSRF token, as the page's own form does.
    pub(crate) async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Reply {
        let mut all = vec![("csrf", self.csrf.as_str())];
        all.extend_from_slice(fields);
        self.post_form(path, &all).await
    }

    async fn lookup(&self, kind: &str, identifier: &str) -> Reply {
        self.post(
            "/console/subjects/lookup",
            &[("kind", kind), ("identifier", identifier)],
        )
        .await
    }
}

const FORM: &str = "application/x-www-form-urlencoded";

/// `fields` as a form body.
fn encoded(fields: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish()
}

/// The value of the first hidden input named `name` in `html`.
fn hidden(html: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html.find(&marker)? + marker.len();
    Some(html[at..].split('"').next()?.to_owned())
}

/// The id of the event a way back recorded, from its outcome.
fn recorded_event(html: &str) -> Option<String> {
    let at = html.find("Recorded as event <a href=\"/console/events/")?;
    let rest = &html[at + "Recorded as event <a href=\"/console/events/".len()..];
    Some(rest.split('"').next()?.to_owned())
}

/// The outcome label a way back shows.
fn outcome_label(html: &str) -> Option<&str> {
    let at = html.find("badge outcome ")?;
    let rest = &html[at..];
    let start = rest.find('>')? + 1;
    let end = rest.find("</code>")?;
    Some(&rest[start..end])
}

const WAYS: [&str; 3] = [
    "/console/subjects/unlock",
    "/console/subjects/lift-deny",
    "/console/subjects/close-case",
];

/// A tenant on the default playbook whose SIM swaps locked, denied and opened a case about
/// [`PHONE`] and about [`ACCOUNT`]; returns the two decisions too.
async fn seeded(backend: Backend) -> (TestDb, Tenant, Server, Value, Value) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let by_phone = server
        .send(&tenant, Some(&new_key()), &sim_swap(PHONE))
        .await;
    assert_eq!(by_phone.status, 200, "{}", by_phone.text());
    let by_account = server
        .send(&tenant, Some(&new_key()), &sim_swap_of_account(ACCOUNT, 60))
        .await;
    assert_eq!(by_account.status, 200, "{}", by_account.text());
    let (by_phone, by_account) = (by_phone.json(), by_account.json());
    assert_eq!(by_account["rule"], "recent_sim_swap");
    (db, tenant, server, by_phone, by_account)
}

/// The subject's lock as the API has it (a read of `POST /v1/subjects/lookup`).
async fn api_lock(server: &Server, tenant: &Tenant, subject: Value) -> Value {
    let reply = Reply::from(
        server
            .client
            .post(format!("{}/v1/subjects/lookup", server.base))
            .bearer_auth(&tenant.api_key)
            .json(&subject)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["lock"].clone()
}

/// No raw identifier in the log or the database.
async fn no_identifier_kept(db: &TestDb, server: &Server) {
    let logs = server.logs();
    for raw in [PHONE, &PHONE[1..], ACCOUNT] {
        assert!(!logs.contains(raw), "{raw} reached the server's log");
    }
    let dump = String::from_utf8_lossy(&db.dump()).into_owned();
    for raw in [&PHONE[1..], ACCOUNT] {
        assert!(!dump.contains(raw), "{raw} is stored");
    }
}

async fn the_console_finds_a_subject_by_phone_and_by_account(backend: Backend) {
    let (db, tenant, server, by_phone, by_account) = seeded(backend).await;
    let admin = Session::sign_in(&server, &tenant.api_key).await;

    for (kind, identifier, decided) in [
        ("phone", PHONE, &by_phone),
        ("account", ACCOUNT, &by_account),
    ] {
        let page = admin.lookup(kind, identifier).await;
        assert_eq!(page.status, 200, "{kind}: {}", page.text());
        let html = page.text();
        assert!(
            html.contains(decided["subject_hash"].as_str().unwrap()),
            "{kind}: the page names the subject's digest: {html}"
        );
        let event = decided["event_id"].as_str().unwrap();
        let lock = html
            .split("<dd class=\"lock\">")
            .nth(1)
            .and_then(|rest| rest.split("</dd>").next())
            .unwrap_or_else(|| panic!("{kind}: no lock on the page: {html}"));
        assert!(lock.contains(">locked<"), "{kind}: {lock}");
        assert!(
            lock.contains(&format!("href=\"/console/events/{event}\"")),
            "{kind}: the lock links to the event that caused it: {lock}"
        );
        assert!(html.contains("<dd class=\"deny\"><span class=\"badge deny\">deny stands"));
        assert!(
            html.contains("<dd class=\"cases\">1</dd>"),
            "one open case: {html}"
        );
        for way in WAYS {
            assert!(
                html.contains(&format!("action=\"{way}\"")),
                "an admin key gets {way}"
            );
        }
    }

    let unknown = admin.lookup("account", "acct-never-seen").await;
    assert_eq!(unknown.status, 200);
    assert!(unknown.text().contains("No event names this subject"));
    let bad_phone = admin.lookup("phone", "12").await;
    assert_eq!(bad_phone.status, 400);
    assert!(bad_phone.text().contains("E.164"), "{}", bad_phone.text());
    let no_kind = admin.lookup("email", "a@example.com").await;
    assert_eq!(no_kind.status, 400);
    assert!(
        no_kind
            .text()
            .contains("Choose a phone number or an account id")
    );

    no_identifier_kept(&db, &server).await;
}

async fn a_read_key_sees_a_subject_but_cannot_take_the_way_back(backend: Backend) {
    let (db, tenant, server, _, by_account) = seeded(backend).await;
    let (_, reader) = db.issue_key(&tenant, "read");
    let read = Session::sign_in(&server, &reader.api_key).await;

    let page = read.lookup("account", ACCOUNT).await;
    assert_eq!(page.status, 200, "{}", page.text());
    let html = page.text();
    assert!(html.contains(by_account["subject_hash"].as_str().unwrap()));
    assert!(html.contains(">locked<"), "a read key sees the lock");
    for way in WAYS {
        assert!(!html.contains(way), "a read key gets no {way} button");
    }
    assert!(html.contains("need an admin key"), "{html}");

    for way in WAYS {
        let refused = read
            .post(
                way,
                &[
                    ("kind", "account"),
                    ("identifier", ACCOUNT),
                    ("reason", "trying"),
                ],
            )
            .await;
        assert_eq!(refused.status, 403, "{way}: {}", refused.text());
        assert!(refused.text().contains("This needs an admin key"));
    }
    let lock = api_lock(&server, &tenant, json!({"account": ACCOUNT})).await;
    assert_eq!(lock["event_id"], by_account["event_id"], "still locked");
    no_identifier_kept(&db, &server).await;
}

async fn an_admin_takes_the_way_back_with_the_sessions_token_and_a_reason(backend: Backend) {
    let (db, tenant, server, _, by_account) = seeded(backend).await;
    let admin = Session::sign_in(&server, &tenant.api_key).await;
    let (_, reader) = db.issue_key(&tenant, "read");
    let other = Session::sign_in(&server, &reader.api_key).await;
    let who = [("kind", "account"), ("identifier", ACCOUNT)];
    let with_reason = |reason: &'static str| {
        let mut fields = who.to_vec();
        fields.push(("reason", reason));
        fields
    };

    // Without this session's CSRF token: no token, an empty one, another session's.
    let no_token = admin
        .post_form(
            "/console/subjects/unlock",
            &with_reason("verified in branch"),
        )
        .await;
    assert_eq!(no_token.status, 403, "{}", no_token.text());
    assert!(no_token.text().contains("The form has expired"));
    for token in ["", other.csrf.as_str()] {
        let mut fields = vec![("csrf", token)];
        fields.extend(with_reason("verified in branch"));
        let forged = admin.post_form("/console/subjects/unlock", &fields).await;
        assert_eq!(forged.status, 403, "{}", forged.text());
    }

    // A bad reason is refused, saying what a reason must be, and the subject is shown again.
    let long = "x".repeat(501);
    for (reason, what) in [
        ("", "an empty reason"),
        ("   ", "a blank reason"),
        (long.as_str(), "501 characters"),
    ] {
        let mut fields = who.to_vec();
        fields.push(("reason", reason));
        let refused = admin.post("/console/subjects/unlock", &fields).await;
        assert_eq!(refused.status, 400, "{what}: {}", refused.text());
        let html = refused.text();
        assert!(
            html.contains("role=\"alert\"")
                && html.contains("must be 1 to 500 characters, saying why"),
            "{what}: {html}"
        );
        assert!(
            html.contains(">locked<"),
            "{what}: the subject is shown again"
        );
    }
    let no_reason = admin.post("/console/subjects/unlock", &who).await;
    assert_eq!(no_reason.status, 400, "a form without a reason");
    let lock = api_lock(&server, &tenant, json!({"account": ACCOUNT})).await;
    assert_eq!(
        lock["event_id"], by_account["event_id"],
        "nothing unlocked yet"
    );

    // Unlocked, recorded as an event with the reason; the page shows the lock gone.
    let unlocked = admin
        .post(
            "/console/subjects/unlock",
            &with_reason("verified in branch"),
        )
        .await;
    assert_eq!(unlocked.status, 200, "{}", unlocked.text());
    let html = unlocked.text();
    assert_eq!(outcome_label(&html), Some("done"), "{html}");
    assert!(html.contains("The account is unlocked."));
    assert!(html.contains(">not locked<"), "{html}");
    let event_id = recorded_event(&html).expect("the outcome links to its event");
    let event = server.event(&tenant, &event_id).await;
    assert_eq!(event["type"], "operator.unlock_account");
    assert_eq!(event["metadata"]["reason"], "verified in branch");
    assert!(
        api_lock(&server, &tenant, json!({"account": ACCOUNT}))
            .await
            .is_null()
    );

    // Again: nothing to undo, nothing recorded.
    let again = admin
        .post(
            "/console/subjects/unlock",
            &with_reason("verified in branch"),
        )
        .await
        .text()
        .into_owned();
    assert_eq!(outcome_label(&again), Some("already_done"), "{again}");
    assert!(again.contains("nothing to unlock"));
    assert!(recorded_event(&again).is_none());

    // Lift the deny and close the case the same way.
    for (way, said) in [
        ("/console/subjects/lift-deny", "The deny is lifted."),
        ("/console/subjects/close-case", "The case is closed."),
    ] {
        let done = admin.post(way, &with_reason("false positive")).await;
        assert_eq!(done.status, 200, "{way}: {}", done.text());
        let html = done.text();
        assert_eq!(outcome_label(&html), Some("done"), "{way}: {html}");
        assert!(html.contains(said));
        assert!(recorded_event(&html).is_some());
    }
    let state = admin.lookup("account", ACCOUNT).await.text().into_owned();
    assert!(
        state.contains(">no deny<") && state.contains("<dd class=\"cases\">0</dd>"),
        "{state}"
    );

    no_identifier_kept(&db, &server).await;
}

on_both_backends!(
    the_console_finds_a_subject_by_phone_and_by_account,
    a_read_key_sees_a_subject_but_cannot_take_the_way_back,
    an_admin_takes_the_way_back_with_the_sessions_token_and_a_reason,
);
