//! HMAC-SHA256 signatures in the `v1,<base64>` format.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;

use crate::secret::LENIENT_STANDARD;
use crate::{HEADER_ID, HEADER_SIGNATURE, HEADER_TIMESTAMP, Secret};

type HmacSha256 = Hmac<Sha256>;

/// Version tag of symmetric HMAC-SHA256 signatures.
const VERSION: &str = "v1";

/// An HMAC keyed with `key` that has absorbed `content`.
fn mac_over(key: &[u8], content: &[u8]) -> HmacSha256 {
    // HMAC hashes or pads keys of any length, so this cannot fail.
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(content);
    mac
}

/// The Standard Webhooks signed content `{id}.{timestamp}.{body}`.
pub(crate) fn signed_content(msg_id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let timestamp = timestamp.to_string();
    let mut content = Vec::with_capacity(msg_id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(msg_id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

impl Secret {
    /// `v1,<base64 HMAC-SHA256(key, content)>` for arbitrary signed content.
    pub fn sign_content(&self, content: &[u8]) -> String {
        self.sign_content_as(VERSION, content)
    }

    /// `<version>,<base64 HMAC-SHA256(key, content)>`: a scheme's own version tag.
    pub fn sign_content_as(&self, version: &str, content: &[u8]) -> String {
        let tag = mac_over(self.as_bytes(), content).finalize().into_bytes();
        format!("{version},{}", STANDARD.encode(tag))
    }

    /// Standard Webhooks signature over `{msg_id}.{timestamp}.{body}`.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        self.sign_content(&signed_content(msg_id, timestamp, body))
    }
}

/// Whether any space-separated `v1,<base64>` value in `header` matches HMAC(secret, content) for any of `secrets`.
///
/// Tags are compared in constant time. Values with another version (such as
/// `v1a` asymmetric signatures) or undecodable base64 are skipped, so one
/// unknown entry cannot mask a valid one. A header with more than
/// [`MAX_SIGNATURES`](crate::verify::MAX_SIGNATURES) entries matches nothing, so a long header
/// cannot buy thousands of comparisons.
pub fn signature_matches(secrets: &[Secret], content: &[u8], header: &str) -> bool {
    signature_matches_as(VERSION, secrets, content, header)
}

/// As [`signature_matches`], for the entries of `version` (`v2,<base64>`, say) alone: a
/// scheme that signs other content under another version tag.
pub fn signature_matches_as(
    version: &str,
    secrets: &[Secret],
    content: &[u8],
    header: &str,
) -> bool {
    if header
        .split_ascii_whitespace()
        .nth(crate::verify::MAX_SIGNATURES)
        .is_some()
    {
        return false;
    }
    let tags: Vec<Vec<u8>> = header
        .split_ascii_whitespace()
        .filter_map(|entry| entry.split_once(','))
        .filter(|(tag, _)| *tag == version)
        .filter_map(|(_, encoded)| LENIENT_STANDARD.decode(encoded).ok())
        .collect();
    if tags.is_empty() {
        return false;
    }
    secrets.iter().any(|secret| {
        // Absorb the content once per secret; each comparison finalizes a clone.
        let mac = mac_over(secret.as_bytes(), content);
        tags.iter().any(|tag| mac.clone().verify_slice(tag).is_ok())
    })
}

/// The `webhook-id`, `webhook-timestamp` and `webhook-signature` headers for a message.
///
/// With several secrets (during rotation) the signature header carries one
/// signature per secret, space-separated, so receivers holding either key
/// accept the message. With no secrets the signature header is empty.
pub fn signed_headers(
    secrets: &[Secret],
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    let content = signed_content(msg_id, timestamp, body);
    let signatures: Vec<String> = secrets.iter().map(|s| s.sign_content(&content)).collect();
    [
        (HEADER_ID, msg_id.to_owned()),
        (HEADER_TIMESTAMP, timestamp.to_string()),
        (HEADER_SIGNATURE, signatures.join(" ")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: &[u8]) -> Secret {
        Secret::from_bytes(b.to_vec())
    }

    #[test]
    fn sign_content_matches_a_known_hmac_sha256() {
        // RFC 4231 test case 2, re-encoded as base64.
        let sig = key(b"Jefe").sign_content(b"what do ya want for nothing?");
        assert_eq!(sig, "v1,W9zBRr9gdU5qBCQmCJV1x1oAPwidJzmDnexYuWTsOEM=");
    }

    #[test]
    fn signed_content_joins_id_timestamp_and_body_with_dots() {
        assert_eq!(signed_content("msg_1", -5, b"{}"), b"msg_1.-5.{}");
    }

    #[test]
    fn signature_matches_skips_other_versions_and_garbage() {
        let secret = key(b"k");
        let good = secret.sign_content(b"content");
        let header = format!("v1a,{} v2,xyz nocomma v1,!!! v1, {good}", &good[3..]);
        assert!(signature_matches(&[secret], b"content", &header));
    }

    #[test]
    fn signature_matches_refuses_more_than_eight_entries_even_with_a_good_one() {
        let secret = key(b"k");
        let good = secret.sign_content(b"content");
        let eight = format!("{} {good}", ["v1,AAAA"; 7].join(" "));
        assert!(signature_matches(
            std::slice::from_ref(&secret),
            b"content",
            &eight
        ));
        let nine = format!("v1,AAAA {eight}");
        assert!(!signature_matches(&[secret], b"content", &nine));
    }

    #[test]
    fn signature_matches_rejects_the_right_tag_under_another_version() {
        let secret = key(b"k");
        let good = secret.sign_content(b"content");
        let header = format!("v2,{}", &good[3..]);
        assert!(!signature_matches(&[secret], b"content", &header));
    }

    #[test]
    fn signature_matches_rejects_truncated_tags() {
        let secret = key(b"k");
        let good = secret.sign_content(b"content");
        let truncated = STANDARD.encode(&STANDARD.decode(&good[3..]).unwrap()[..16]);
        let header = format!("v1,{truncated}");
        assert!(!signature_matches(&[secret], b"content", &header));
    }

    #[test]
    fn signature_matches_is_false_without_secrets_or_signatures() {
        let secret = key(b"k");
        let good = secret.sign_content(b"content");
        assert!(!signature_matches(&[], b"content", &good));
        assert!(!signature_matches(&[secret], b"content", ""));
    }

    #[test]
    fn signed_headers_carry_one_signature_per_secret() {
        let (a, b) = (key(b"a"), key(b"b"));
        let headers = signed_headers(&[a.clone(), b.clone()], "msg_1", 42, b"body");
        assert_eq!(headers[0], ("webhook-id", "msg_1".to_owned()));
        assert_eq!(headers[1], ("webhook-timestamp", "42".to_owned()));
        let expected = format!(
            "{} {}",
            a.sign("msg_1", 42, b"body"),
            b.sign("msg_1", 42, b"body")
        );
        assert_eq!(headers[2], ("webhook-signature", expected));
    }
}
