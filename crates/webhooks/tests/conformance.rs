//! The SDKs' shared conformance corpus (`sdks/conformance/`), read here as the Python and
//! TypeScript tests read it, so the three implementations cannot drift apart: every expected
//! signature (made by the reference library) is what this crate signs and verifies, and every
//! envelope a real verdict sent parses as an [`Envelope`] and verifies with its secret.

use serde_json::Value;
use verdict_webhooks::{Envelope, Headers, Secret, Verifier};

/// One corpus file's `cases`.
fn cases(file: &str) -> Vec<Value> {
    let path = format!(
        "{}/../../sdks/conformance/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let document: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let cases = document["cases"]
        .as_array()
        .expect("a `cases` array")
        .clone();
    assert!(!cases.is_empty(), "{path} has no cases");
    cases
}

fn text<'a>(case: &'a Value, field: &str) -> &'a str {
    case[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {case}"))
}

#[test]
fn every_corpus_signature_is_what_this_crate_signs_and_verifies() {
    for case in cases("signatures.json") {
        let name = text(&case, "name");
        let secret = Secret::parse(text(&case, "secret")).expect(name);
        let id = text(&case, "id");
        let timestamp = case["timestamp"].as_i64().expect(name);
        let body = text(&case, "body").as_bytes();
        let expected = text(&case, "expected");
        assert_eq!(secret.sign(id, timestamp, body), expected, "{name}");

        let timestamp_text = timestamp.to_string();
        let headers = Headers {
            id,
            timestamp: &timestamp_text,
            signature: expected,
        };
        let verifier = Verifier::new(vec![Secret::generate(), secret]);
        assert_eq!(
            verifier.verify(&headers, body, timestamp),
            Ok(timestamp),
            "{name}"
        );
        let mut tampered = body.to_vec();
        tampered.push(b' ');
        assert!(
            verifier.verify(&headers, &tampered, timestamp).is_err(),
            "{name}: a tampered body verified"
        );
    }
}

#[test]
fn every_corpus_envelope_parses_and_verifies_as_verdict_sent_it() {
    for case in cases("envelopes.json") {
        let name = text(&case, "name");
        let body = text(&case, "body");
        let envelope: Envelope = serde_json::from_str(body).expect(name);
        assert_eq!(
            serde_json::to_value(&envelope).expect(name),
            case["envelope"],
            "{name}: the parsed fields are not the corpus's"
        );
        assert!(envelope.event_type.starts_with("decision."), "{name}");

        let headers = &case["headers"];
        let timestamp = text(headers, "webhook-timestamp");
        let parsed = Headers {
            id: text(headers, "webhook-id"),
            timestamp,
            signature: text(headers, "webhook-signature"),
        };
        let secret = Secret::parse(text(&case, "webhook_secret")).expect(name);
        let at: i64 = timestamp.parse().expect(name);
        assert_eq!(
            Verifier::new(vec![secret]).verify(&parsed, body.as_bytes(), at),
            Ok(at),
            "{name}"
        );
    }
}
