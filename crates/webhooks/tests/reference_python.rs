//! Cross-checks against the reference Python implementation (PyPI `standardwebhooks`).
//!
//! Requires `python3` with `pip install standardwebhooks`; fails, rather than
//! skips, when either is missing so CI cannot silently lose the check. Set
//! `PYTHON` to use another interpreter.
//!
//! Every field crosses the process boundary as base64, so bytes are exact.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderValue};
use verdict_webhooks::{Headers, Secret, Verifier, signed_headers};

const INSTALL_HINT: &str = "the reference cross-check needs Python 3 with the `standardwebhooks` \
    package: run `pip install standardwebhooks` (or set PYTHON to an interpreter that has it)";

/// Reads `op` lines of base64 fields on stdin and answers one line each.
///
/// `verify <secret> <id> <ts> <body> <sig>` -> `ok` or `error <Type>: <message>`;
/// `sign <secret> <id> <ts> <body>` -> `sig <signature>`.
const SCRIPT: &str = r#"
import base64, sys
from datetime import datetime, timezone
try:
    from standardwebhooks.webhooks import Webhook
except ImportError as e:
    print(f"import-error {e}", flush=True)
    sys.exit(3)

def d(s):
    return base64.b64decode(s)

for line in sys.stdin:
    # split(" ") keeps empty fields (an empty body encodes to "").
    op, *f = line.rstrip("\n").split(" ")
    secret, msg_id, ts, body = d(f[0]).decode(), d(f[1]).decode(), d(f[2]).decode(), d(f[3])
    if op == "verify":
        headers = {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": d(f[4]).decode()}
        try:
            # json_parse=False: bodies here need not be JSON.
            Webhook(secret).verify(body, headers, json_parse=False)
            print("ok")
        except Exception as e:
            print(f"error {type(e).__name__}: {e}")
    elif op == "sign":
        # sign() takes the body as str and the time as a datetime it reads as UTC.
        when = datetime.fromtimestamp(int(ts), tz=timezone.utc)
        print("sig " + Webhook(secret).sign(msg_id, when, body.decode("utf-8")))
    else:
        raise SystemExit(f"unknown op {op}")
"#;

const VECTOR_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const VECTOR_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
const VECTOR_TIMESTAMP: i64 = 1649367553;
const VECTOR_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
const VECTOR_SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

/// Body with multi-byte characters, newlines, CR and a tab, to catch any re-encoding.
const UNICODE_BODY: &str =
    "{\"name\":\"Zoë Ångström 名前 🚀\",\n\"note\":\"line1\r\nline2\\n\t\"}\n";

fn b64(bytes: impl AsRef<[u8]>) -> String {
    STANDARD.encode(bytes)
}

fn now() -> i64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    i64::try_from(since_epoch.as_secs()).expect("time fits i64")
}

/// Runs the reference script over `requests`, returning one answer line per request.
fn run_python(requests: &[String]) -> Vec<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let mut child = Command::new(&python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{python}` ({e}); {INSTALL_HINT}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    // Write errors (python exited early) surface below via its output and status.
    for request in requests {
        if writeln!(stdin, "{request}").is_err() {
            break;
        }
    }
    drop(stdin);
    let output = child.wait_with_output().expect("python finished");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if let Some(err) = stdout.lines().find(|l| l.starts_with("import-error")) {
        panic!("`{python}` cannot import standardwebhooks ({err}); {INSTALL_HINT}");
    }
    assert!(
        output.status.success(),
        "reference script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let answers: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert_eq!(
        answers.len(),
        requests.len(),
        "one answer per request:\n{stdout}\n{stderr}"
    );
    answers
}

fn verify_request(secret: &str, id: &str, ts: i64, body: &[u8], signature: &str) -> String {
    format!(
        "verify {} {} {} {} {}",
        b64(secret),
        b64(id),
        b64(ts.to_string()),
        b64(body),
        b64(signature)
    )
}

fn sign_request(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
    format!(
        "sign {} {} {} {}",
        b64(secret),
        b64(id),
        b64(ts.to_string()),
        b64(body)
    )
}

/// Asks the reference library to sign, returning its `webhook-signature` value.
fn python_sign(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
    let answer = run_python(&[sign_request(secret, id, ts, body)]).remove(0);
    answer
        .strip_prefix("sig ")
        .unwrap_or_else(|| panic!("unexpected answer {answer:?}"))
        .to_owned()
}

#[test]
fn python_reference_verifies_messages_signed_by_this_crate() {
    let ts = now();
    let vector = Secret::parse(VECTOR_SECRET).unwrap();
    let generated = Secret::generate();
    let unpadded = Secret::from_bytes(b"a 31-byte key needing b64 pad!!".to_vec());
    let mut cases: Vec<(&str, Secret, String, Vec<u8>, String)> = Vec::new();

    // The published vector's id, body and secret, re-signed at the current time.
    let sig = vector.sign(VECTOR_ID, ts, VECTOR_BODY);
    cases.push((
        "vector at now",
        vector.clone(),
        VECTOR_ID.into(),
        VECTOR_BODY.into(),
        sig,
    ));

    let body = UNICODE_BODY.as_bytes().to_vec();
    let sig = generated.sign("msg_unicode", ts, &body);
    cases.push((
        "unicode body",
        generated.clone(),
        "msg_unicode".into(),
        body,
        sig,
    ));

    let sig = unpadded.sign("msg_empty", ts, b"");
    cases.push(("empty body", unpadded, "msg_empty".into(), Vec::new(), sig));

    // Rotation: the sender signs with old and new keys; a receiver holding either accepts.
    let body = br#"{"decision":"deny","risk":0.97}"#.to_vec();
    let [_, _, (_, rotated)] =
        signed_headers(&[vector.clone(), generated.clone()], "msg_rot", ts, &body);
    assert_eq!(rotated.split(' ').count(), 2, "rotation header {rotated:?}");
    cases.push((
        "rotation, old key",
        vector.clone(),
        "msg_rot".into(),
        body.clone(),
        rotated.clone(),
    ));
    cases.push((
        "rotation, new key",
        generated,
        "msg_rot".into(),
        body,
        rotated,
    ));

    let requests: Vec<String> = cases
        .iter()
        .map(|(_, secret, id, body, sig)| verify_request(&secret.to_whsec(), id, ts, body, sig))
        .collect();
    let answers = run_python(&requests);
    for ((name, ..), answer) in cases.iter().zip(&answers) {
        assert_eq!(answer, "ok", "python rejected case {name:?}");
    }
}

#[test]
fn python_reference_rejects_tampered_messages_signed_by_this_crate() {
    // Guards the harness itself: it must be able to say no.
    let ts = now();
    let secret = Secret::generate();
    let sig = secret.sign("msg_tamper", ts, UNICODE_BODY.as_bytes());
    let mut tampered = UNICODE_BODY.as_bytes().to_vec();
    tampered[1] ^= 0x01;
    let other = Secret::generate().to_whsec();
    let requests = [
        verify_request(&secret.to_whsec(), "msg_tamper", ts, &tampered, &sig),
        verify_request(&other, "msg_tamper", ts, UNICODE_BODY.as_bytes(), &sig),
    ];
    for answer in run_python(&requests) {
        assert!(
            answer.contains("No matching signature"),
            "python answered {answer:?}"
        );
    }
}

#[test]
fn python_reference_signs_the_published_vector_like_this_crate() {
    let python = python_sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY);
    assert_eq!(python, VECTOR_SIGNATURE);
    let ours = Secret::parse(VECTOR_SECRET)
        .unwrap()
        .sign(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY);
    assert_eq!(ours, python);
}

#[test]
fn this_crate_verifies_a_message_signed_by_python_reference() {
    let ts = now();
    let secret = Secret::generate();
    let id = "msg_from_python";
    let signature = python_sign(&secret.to_whsec(), id, ts, UNICODE_BODY.as_bytes());

    // Through a real HeaderMap, as a receiver would see the request.
    let mut map = HeaderMap::new();
    map.insert("webhook-id", HeaderValue::from_static(id));
    map.insert("webhook-timestamp", HeaderValue::from(ts));
    map.insert(
        "webhook-signature",
        HeaderValue::from_str(&signature).unwrap(),
    );
    let headers = Headers::from_http(&map).unwrap();

    let verifier = Verifier::new(vec![Secret::generate(), secret]);
    assert_eq!(
        verifier.verify(&headers, UNICODE_BODY.as_bytes(), ts),
        Ok(ts)
    );
    let mut tampered = UNICODE_BODY.as_bytes().to_vec();
    tampered.push(b' ');
    assert!(verifier.verify(&headers, &tampered, ts).is_err());
}
