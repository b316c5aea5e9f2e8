//! Arbitrary requests against the real server: every answer is a decision or a clear 4xx
//! problem, never a 5xx, and a request refused before the claim leaves no key row behind.

use crate::common::{Backend, Reply, Server, Tenant, TestDb, now, sim_swap};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// One generated request.
#[derive(Clone, Debug)]
struct Attempt {
    body: Vec<u8>,
    key: Option<Vec<u8>>,
    content_type: &'static str,
    signature: SignatureKind,
}

#[derive(Clone, Copy, Debug)]
enum SignatureKind {
    Valid,
    Missing,
    WrongSecret,
    Stale,
}

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    let valid = sim_swap("+447700900700").into_bytes();
    let unchanged = valid.clone();
    prop_oneof![
        // A valid signal, as is.
        3 => Just(unchanged),
        // A valid signal with a few bytes overwritten.
        2 =>
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4).prop_map(
            move |edits| {
                let mut b = valid.clone();
                for (i, byte) in edits {
                    let at = i.index(b.len());
                    b[at] = byte;
                }
                b
            }
        ),
        // JSON-ish text.
        1 => "[{}\\[\\]\":,a-z0-9 +.-]{0,200}".prop_map(String::into_bytes),
        // Anything at all.
        1 => proptest::collection::vec(any::<u8>(), 0..300),
    ]
}

fn attempt_strategy() -> impl Strategy<Value = Attempt> {
    (
        body_strategy(),
        proptest::option::of(prop_oneof![
            3 => "[0-9a-f]{8}-[0-9a-f]{4}".prop_map(String::into_bytes),
            1 => "[ -~]{0,300}".prop_map(String::into_bytes),
            1 => "\"[ -~]{0,20}\"?".prop_map(String::into_bytes),
            1 => proptest::collection::vec(any::<u8>(), 0..40),
        ]),
        prop::sample::select(vec![
            "application/json",
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
            "",
        ]),
        prop::sample::select(vec![
            SignatureKind::Valid,
            SignatureKind::Valid,
            SignatureKind::Valid,
            SignatureKind::Missing,
            SignatureKind::WrongSecret,
            SignatureKind::Stale,
        ]),
    )
        .prop_map(|(body, key, content_type, signature)| Attempt {
            body,
            key,
            content_type,
            signature,
        })
}

async fn send(server: &Server, tenant: &Tenant, a: &Attempt) -> Option<Reply> {
    let ts = match a.signature {
        SignatureKind::Stale => now() - 1000,
        _ => now(),
    };
    let secret = match a.signature {
        SignatureKind::WrongSecret => verdict_webhooks::Secret::generate(),
        _ => verdict_webhooks::Secret::parse(&tenant.signing_secret).unwrap(),
    };
    let mut content = format!("{ts}.").into_bytes();
    content.extend_from_slice(&a.body);
    let mut req = server
        .client
        .post(format!("{}/v1/signals", server.base))
        .bearer_auth(&tenant.api_key)
        .body(a.body.clone());
    if !a.content_type.is_empty() {
        req = req.header("content-type", a.content_type);
    }
    if !matches!(a.signature, SignatureKind::Missing) {
        // `v2` over the key as sent (a quoted key's signature then fails: another 401).
        let mut keyed = format!("{ts}.").into_bytes();
        keyed.extend_from_slice(a.key.as_deref().unwrap_or_default());
        keyed.push(b'.');
        keyed.extend_from_slice(&a.body);
        let signature = format!(
            "{} {}",
            secret.sign_content_as("v2", &keyed),
            secret.sign_content(&content)
        );
        req = req
            .header("verdict-timestamp", ts.to_string())
            .header("verdict-signature", signature);
    }
    if let Some(key) = &a.key {
        // Bytes a header cannot carry at all are not a request anyone can send.
        let value = reqwest::header::HeaderValue::from_bytes(key).ok()?;
        req = req.header("idempotency-key", value);
    }
    Some(Reply::from(req.send().await.ok()?).await)
}

async fn arbitrary_requests_get_a_decision_or_a_clear_4xx_and_never_claim_when_refused(
    backend: Backend,
) {
    let db = TestDb::new(backend).await;
    let tenant = db.tenant(&[]);
    let server = Server::start(&db, &[]);
    let mut runner = TestRunner::new(Config {
        cases: 200,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    let seen = std::sync::Mutex::new(std::collections::BTreeMap::<u16, usize>::new());
    let result = tokio::task::block_in_place(|| {
        runner.run(&attempt_strategy(), |attempt| {
            handle.block_on(async {
                let before = db.count("idempotency_keys").await;
                let Some(reply) = send(&server, &tenant, &attempt).await else {
                    return Ok(());
                };
                let after = db.count("idempotency_keys").await;
                *seen.lock().unwrap().entry(reply.status).or_default() += 1;
                prop_assert!(reply.status < 500, "{} for {attempt:?}", reply.status);
                match reply.status {
                    200 => {}
                    400 | 401 | 413 | 415 => {
                        prop_assert_eq!(
                            reply.header("content-type"),
                            Some("application/problem+json")
                        );
                        let problem = reply.json();
                        prop_assert!(
                            problem["type"]
                                .as_str()
                                .unwrap()
                                .starts_with("https://verdict.dev/problems/")
                        );
                        prop_assert!(problem["detail"].is_string());
                        prop_assert_eq!(before, after, "a refused request claimed a key");
                    }
                    409 | 422 => {}
                    other => prop_assert!(false, "unexpected status {other} for {attempt:?}"),
                }
                Ok(())
            })
        })
    });
    if let Err(e) = result {
        panic!("{e}\nserver logs:\n{}", server.logs());
    }
    assert!(!server.logs().contains("panicked"), "the server panicked");
    let seen = seen.into_inner().unwrap();
    for status in [200, 400, 401] {
        assert!(
            seen.contains_key(&status),
            "the generator never reached a {status}: {seen:?}"
        );
    }
}

on_both_backends!(arbitrary_requests_get_a_decision_or_a_clear_4xx_and_never_claim_when_refused);
