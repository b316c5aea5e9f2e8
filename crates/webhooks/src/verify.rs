//! Receiver-side verification of signed webhook requests.

use http::HeaderMap;

use crate::signature::{signature_matches, signed_content};
use crate::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Secret, VerifyError};

/// Tolerance both ways for timestamps: 300 s.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

/// The most entries a `webhook-signature` header may carry. A sender lists one per live
/// secret (two during a rotation); a header with more is refused before any HMAC is computed,
/// so a request cannot buy (entries × secrets) HMACs for the price of one.
pub const MAX_SIGNATURES: usize = 8;

/// The three header values of a Standard Webhooks request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    /// `webhook-id`: the unique message id, stable across retries.
    pub id: &'a str,
    /// `webhook-timestamp`: unix seconds at signing.
    pub timestamp: &'a str,
    /// `webhook-signature`: space-separated `v1,<base64>` signatures.
    pub signature: &'a str,
}

impl<'a> Headers<'a> {
    /// Reads the three headers; an absent, empty or non-UTF-8 value is `MissingHeader(name)`.
    pub fn from_http(map: &'a HeaderMap) -> Result<Headers<'a>, VerifyError> {
        Ok(Headers {
            id: header(map, HEADER_ID)?,
            timestamp: header(map, HEADER_TIMESTAMP)?,
            signature: header(map, HEADER_SIGNATURE)?,
        })
    }
}

/// One header's value as text.
fn header<'a>(map: &'a HeaderMap, name: &'static str) -> Result<&'a str, VerifyError> {
    // UTF-8 rather than `to_str`'s visible ASCII, because the id is signed as
    // raw bytes and senders may use non-ASCII ids. An empty id is refused like
    // a missing one (as the reference library does) since receivers dedupe on it.
    map.get(name)
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .filter(|v| !v.is_empty())
        .ok_or(VerifyError::MissingHeader(name))
}

/// A verifier holding one or more secrets (several during rotation) and a tolerance.
#[derive(Debug, Clone)]
pub struct Verifier {
    secrets: Vec<Secret>,
    tolerance_secs: i64,
}

impl Verifier {
    /// A verifier accepting any of `secrets`, with tolerance [`DEFAULT_TOLERANCE_SECS`].
    pub fn new(secrets: Vec<Secret>) -> Verifier {
        Verifier {
            secrets,
            tolerance_secs: DEFAULT_TOLERANCE_SECS,
        }
    }

    /// Sets the allowed clock skew in seconds, both ways; negative values count as 0.
    pub fn with_tolerance(self, secs: i64) -> Verifier {
        Verifier {
            tolerance_secs: secs.max(0),
            ..self
        }
    }

    /// Checks timestamp freshness at `now` (unix seconds), then the signature over the raw body; returns the timestamp.
    ///
    /// Freshness and the number of signatures ([`MAX_SIGNATURES`]) are checked first, so stale
    /// replays and stuffed headers are refused before any HMAC work.
    pub fn verify(&self, headers: &Headers<'_>, body: &[u8], now: i64) -> Result<i64, VerifyError> {
        let timestamp = parse_timestamp(headers.timestamp)?;
        // Compare in i128 so extreme timestamps cannot overflow.
        let age = i128::from(now) - i128::from(timestamp);
        let tolerance = i128::from(self.tolerance_secs);
        if age > tolerance {
            return Err(VerifyError::TimestampTooOld);
        }
        if -age > tolerance {
            return Err(VerifyError::TimestampTooNew);
        }
        if headers
            .signature
            .split_ascii_whitespace()
            .take(MAX_SIGNATURES + 1)
            .count()
            > MAX_SIGNATURES
        {
            return Err(VerifyError::TooManySignatures);
        }
        let content = signed_content(headers.id, timestamp, body);
        if signature_matches(&self.secrets, &content, headers.signature) {
            Ok(timestamp)
        } else {
            Err(VerifyError::NoMatchingSignature)
        }
    }
}

/// Parses a timestamp written as the sender formats it: decimal digits, optional leading `-`.
fn parse_timestamp(s: &str) -> Result<i64, VerifyError> {
    // Only the canonical form is accepted ("+1", "01", " 1" are not): the
    // signature covers the re-formatted integer, so other spellings would let
    // distinct header values verify against one signature.
    let timestamp: i64 = s.parse().map_err(|_| VerifyError::InvalidTimestamp)?;
    if timestamp.to_string() != s {
        return Err(VerifyError::InvalidTimestamp);
    }
    Ok(timestamp)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::signed_headers;

    // The published Standard Webhooks test vector.
    const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const MSG_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const TIMESTAMP: i64 = 1649367553;
    const TIMESTAMP_STR: &str = "1649367553";
    const BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn secret() -> Secret {
        Secret::parse(SECRET).unwrap()
    }

    fn other_secret() -> Secret {
        Secret::from_bytes(b"another secret entirely".to_vec())
    }

    fn headers(signature: &str) -> Headers<'_> {
        Headers {
            id: MSG_ID,
            timestamp: TIMESTAMP_STR,
            signature,
        }
    }

    #[test]
    fn signing_the_published_vector_gives_the_published_signature() {
        assert_eq!(secret().sign(MSG_ID, TIMESTAMP, BODY), SIGNATURE);
    }

    #[test]
    fn the_published_vector_verifies_at_its_own_timestamp() {
        let verifier = Verifier::new(vec![secret()]);
        assert_eq!(
            verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP),
            Ok(TIMESTAMP)
        );
    }

    #[test]
    fn timestamps_exactly_at_the_tolerance_are_accepted() {
        let verifier = Verifier::new(vec![secret()]);
        for now in [TIMESTAMP + 300, TIMESTAMP - 300] {
            assert_eq!(
                verifier.verify(&headers(SIGNATURE), BODY, now),
                Ok(TIMESTAMP)
            );
        }
    }

    #[test]
    fn a_timestamp_301_seconds_old_is_too_old() {
        let verifier = Verifier::new(vec![secret()]);
        let result = verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP + 301);
        assert_eq!(result, Err(VerifyError::TimestampTooOld));
    }

    #[test]
    fn a_timestamp_301_seconds_ahead_is_too_new() {
        let verifier = Verifier::new(vec![secret()]);
        let result = verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP - 301);
        assert_eq!(result, Err(VerifyError::TimestampTooNew));
    }

    #[test]
    fn a_body_changed_by_one_byte_is_rejected() {
        let verifier = Verifier::new(vec![secret()]);
        let mut body = BODY.to_vec();
        body[10] ^= 0x01;
        let result = verifier.verify(&headers(SIGNATURE), &body, TIMESTAMP);
        assert_eq!(result, Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn a_verifier_with_another_secret_rejects_the_vector() {
        let verifier = Verifier::new(vec![other_secret()]);
        let result = verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP);
        assert_eq!(result, Err(VerifyError::NoMatchingSignature));
    }

    #[test]
    fn a_header_with_a_wrong_and_the_right_signature_is_accepted() {
        let verifier = Verifier::new(vec![secret()]);
        let wrong = other_secret().sign(MSG_ID, TIMESTAMP, BODY);
        let header = format!("{wrong} {SIGNATURE}");
        assert_eq!(
            verifier.verify(&headers(&header), BODY, TIMESTAMP),
            Ok(TIMESTAMP)
        );
    }

    #[test]
    fn a_verifier_accepts_when_only_its_second_secret_matches() {
        let verifier = Verifier::new(vec![other_secret(), secret()]);
        assert_eq!(
            verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP),
            Ok(TIMESTAMP)
        );
    }

    #[test]
    fn a_changed_id_or_timestamp_is_rejected() {
        let verifier = Verifier::new(vec![secret()]);
        let other_id = Headers {
            id: "msg_other",
            ..headers(SIGNATURE)
        };
        let later = Headers {
            timestamp: "1649367554",
            ..headers(SIGNATURE)
        };
        for h in [other_id, later] {
            let result = verifier.verify(&h, BODY, TIMESTAMP);
            assert_eq!(result, Err(VerifyError::NoMatchingSignature));
        }
    }

    #[test]
    fn non_canonical_timestamps_are_invalid() {
        let verifier = Verifier::new(vec![secret()]);
        for ts in [
            "",
            "abc",
            "1649367553.0",
            "+1649367553",
            "01649367553",
            " 1649367553",
        ] {
            let h = Headers {
                timestamp: ts,
                ..headers(SIGNATURE)
            };
            let result = verifier.verify(&h, BODY, TIMESTAMP);
            assert_eq!(
                result,
                Err(VerifyError::InvalidTimestamp),
                "timestamp {ts:?}"
            );
        }
    }

    #[test]
    fn the_timestamp_is_checked_before_the_signature() {
        let verifier = Verifier::new(vec![secret()]);
        let result = verifier.verify(&headers("v1,bogus"), BODY, TIMESTAMP + 1000);
        assert_eq!(result, Err(VerifyError::TimestampTooOld));
    }

    #[test]
    fn more_than_eight_signatures_are_refused_even_with_a_matching_one() {
        let verifier = Verifier::new(vec![secret()]);
        let wrong = other_secret().sign(MSG_ID, TIMESTAMP, BODY);
        let header = |n: usize| {
            let mut entries = vec![wrong.as_str(); n - 1];
            entries.push(SIGNATURE);
            entries.join(" ")
        };
        let eight = header(MAX_SIGNATURES);
        assert_eq!(
            verifier.verify(&headers(&eight), BODY, TIMESTAMP),
            Ok(TIMESTAMP)
        );
        let nine = header(MAX_SIGNATURES + 1);
        assert_eq!(
            verifier.verify(&headers(&nine), BODY, TIMESTAMP),
            Err(VerifyError::TooManySignatures)
        );
    }

    #[test]
    fn extreme_timestamps_do_not_overflow() {
        let verifier = Verifier::new(vec![secret()]).with_tolerance(i64::MAX);
        let h = Headers {
            timestamp: "-9223372036854775808",
            ..headers(SIGNATURE)
        };
        let result = verifier.verify(&h, BODY, i64::MAX);
        assert_eq!(result, Err(VerifyError::TimestampTooOld));
    }

    #[test]
    fn a_custom_tolerance_is_enforced() {
        let verifier = Verifier::new(vec![secret()]).with_tolerance(10);
        let result = verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP + 11);
        assert_eq!(result, Err(VerifyError::TimestampTooOld));
        assert_eq!(
            verifier.verify(&headers(SIGNATURE), BODY, TIMESTAMP + 10),
            Ok(TIMESTAMP)
        );
    }

    #[test]
    fn headers_are_read_from_a_header_map_case_insensitively() {
        let mut map = HeaderMap::new();
        map.insert("Webhook-Id", HeaderValue::from_static(MSG_ID));
        map.insert("WEBHOOK-TIMESTAMP", HeaderValue::from_static(TIMESTAMP_STR));
        map.insert("webhook-signature", HeaderValue::from_static(SIGNATURE));
        let h = Headers::from_http(&map).unwrap();
        assert_eq!(h, headers(SIGNATURE));
        let verifier = Verifier::new(vec![secret()]);
        assert_eq!(verifier.verify(&h, BODY, TIMESTAMP), Ok(TIMESTAMP));
    }

    #[test]
    fn a_missing_or_empty_header_is_reported_by_name() {
        let full = signed_headers(&[secret()], MSG_ID, TIMESTAMP, BODY);
        for &(missing, _) in &full {
            let mut map = HeaderMap::new();
            for (name, value) in &full {
                if *name != missing {
                    map.insert(*name, HeaderValue::from_str(value).unwrap());
                }
            }
            assert_eq!(
                Headers::from_http(&map),
                Err(VerifyError::MissingHeader(missing))
            );
            map.insert(missing, HeaderValue::from_static(""));
            assert_eq!(
                Headers::from_http(&map),
                Err(VerifyError::MissingHeader(missing))
            );
        }
    }

    #[test]
    fn a_non_utf8_header_is_reported_as_missing() {
        let mut map = HeaderMap::new();
        map.insert("webhook-id", HeaderValue::from_bytes(b"msg_\xff").unwrap());
        map.insert("webhook-timestamp", HeaderValue::from_static(TIMESTAMP_STR));
        map.insert("webhook-signature", HeaderValue::from_static(SIGNATURE));
        assert_eq!(
            Headers::from_http(&map),
            Err(VerifyError::MissingHeader("webhook-id"))
        );
    }

    #[test]
    fn a_utf8_message_id_is_read_and_verified() {
        let id = "msg_ü";
        let sig = secret().sign(id, TIMESTAMP, BODY);
        let mut map = HeaderMap::new();
        map.insert(
            "webhook-id",
            HeaderValue::from_bytes(id.as_bytes()).unwrap(),
        );
        map.insert("webhook-timestamp", HeaderValue::from_static(TIMESTAMP_STR));
        map.insert("webhook-signature", HeaderValue::from_str(&sig).unwrap());
        let h = Headers::from_http(&map).unwrap();
        assert_eq!(h.id, id);
        let verifier = Verifier::new(vec![secret()]);
        assert_eq!(verifier.verify(&h, BODY, TIMESTAMP), Ok(TIMESTAMP));
    }

    #[test]
    fn signed_headers_verify_with_either_rotated_secret() {
        let (old, new) = (secret(), other_secret());
        let sent = signed_headers(&[old.clone(), new.clone()], MSG_ID, TIMESTAMP, BODY);
        let h = Headers {
            id: &sent[0].1,
            timestamp: &sent[1].1,
            signature: &sent[2].1,
        };
        for s in [old, new] {
            assert_eq!(
                Verifier::new(vec![s]).verify(&h, BODY, TIMESTAMP),
                Ok(TIMESTAMP)
            );
        }
    }
}
