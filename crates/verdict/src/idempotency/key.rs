//! A validated `Idempotency-Key` header value.

/// Longest key accepted, in characters, after unquoting.
pub const MAX_KEY_LEN: usize = 255;

/// An idempotency key that passed validation; once you hold one it is valid.
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Why a header value is not a valid idempotency key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than {MAX_KEY_LEN} characters")]
    TooLong,
    #[error("the Idempotency-Key may contain only visible ASCII characters")]
    NotVisibleAscii,
    #[error("the Idempotency-Key is a malformed quoted string")]
    BadQuoting,
    #[error("the Idempotency-Key header was sent more than once")]
    Repeated,
    #[error("the Idempotency-Key differs from the webhook-id the signature covers")]
    DiffersFromWebhookId,
}

impl IdempotencyKey {
    /// Parses the header value: the draft's Structured Field string (`"…"`, with `\"` and `\\`
    /// escapes) or, as Stripe's clients send it, a bare token.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let value = match raw {
            [] => return Err(KeyError::Empty),
            [b'"', rest @ ..] => unquote(rest)?,
            bare => bare.to_vec(),
        };
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(KeyError::NotVisibleAscii);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        // Every byte is visible ASCII, so this cannot fail.
        String::from_utf8(value)
            .map(Self)
            .map_err(|_| KeyError::NotVisibleAscii)
    }

    /// The key's bytes, for digesting. Never log or store these.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdempotencyKey(..)")
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::parse(value.as_bytes())
    }
}

/// RFC 8941 §4.2.5: the body of an sf-string after its opening quote.
fn unquote(rest: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut out = Vec::with_capacity(rest.len());
    let mut bytes = rest.iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c),
                _ => return Err(KeyError::BadQuoting),
            },
            b'"' => {
                return if bytes.next().is_none() {
                    Ok(out)
                } else {
                    Err(KeyError::BadQuoting)
                };
            }
            0x20..=0x7e => out.push(b),
            _ => return Err(KeyError::NotVisibleAscii),
        }
    }
    Err(KeyError::BadQuoting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_and_quoted_forms_name_the_same_key() {
        let bare = IdempotencyKey::parse(b"abc-123").unwrap();
        let quoted = IdempotencyKey::parse(b"\"abc-123\"").unwrap();
        assert_eq!(bare, quoted);
    }

    #[test]
    fn quoted_escapes_are_unescaped() {
        let key = IdempotencyKey::parse(br#""a\"b\\c""#).unwrap();
        assert_eq!(key.as_bytes(), br#"a"b\c"#);
    }

    #[test]
    fn malformed_keys_are_refused_with_a_reason() {
        assert_eq!(IdempotencyKey::parse(b""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(IdempotencyKey::parse(b"\"a\"b"), Err(KeyError::BadQuoting));
        assert_eq!(
            IdempotencyKey::parse(b"\"a\\nb\""),
            Err(KeyError::BadQuoting)
        );
        assert_eq!(
            IdempotencyKey::parse(b"has space"),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"\"in space\""),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse("caf\u{e9}".as_bytes()),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(IdempotencyKey::parse(&[b'k'; 256]), Err(KeyError::TooLong));
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
    }

    proptest! {
        #[test]
        fn parse_never_panics(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = IdempotencyKey::parse(&raw);
        }

        #[test]
        fn every_visible_ascii_token_round_trips_bare_and_quoted(key in "[!-~]{1,255}") {
            let bare = IdempotencyKey::parse(key.as_bytes());
            prop_assume!(!key.starts_with('"'));
            let bare = bare.unwrap();
            prop_assert_eq!(bare.as_bytes(), key.as_bytes());
            let quoted = format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""));
            prop_assert_eq!(IdempotencyKey::parse(quoted.as_bytes()).unwrap(), bare);
        }

        #[test]
        fn accepted_keys_are_visible_ascii_within_length(raw in "\\PC{0,300}") {
            if let Ok(key) = IdempotencyKey::parse(raw.as_bytes()) {
                prop_assert!(!key.as_bytes().is_empty() && key.as_bytes().len() <= MAX_KEY_LEN);
                prop_assert!(key.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b)));
            }
        }
    }
}
