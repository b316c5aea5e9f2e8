//! Signing secrets and their `whsec_` wire form.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use rand::RngCore as _;

use crate::Error;

/// Prefix of a secret's wire form.
const PREFIX: &str = "whsec_";

/// Length of generated secrets; the spec allows 24 to 64 bytes.
const GENERATED_LEN: usize = 32;

/// Standard alphabet that decodes with or without padding, since both forms circulate.
pub(crate) const LENIENT_STANDARD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A signing secret; `whsec_<base64>` on the wire, the decoded bytes are the HMAC key.
#[derive(Clone)]
pub struct Secret {
    bytes: Vec<u8>,
}

impl Secret {
    /// Generates a secret of 32 bytes from the thread-local CSPRNG.
    pub fn generate() -> Secret {
        let mut bytes = vec![0u8; GENERATED_LEN];
        rand::rng().fill_bytes(&mut bytes);
        Secret { bytes }
    }

    /// Parses `whsec_<base64>` (padded or not, surrounding whitespace ignored); rejects empty or malformed secrets.
    pub fn parse(s: &str) -> Result<Secret, Error> {
        // Secrets often arrive from env vars or files with a trailing newline.
        let encoded = s
            .trim()
            .strip_prefix(PREFIX)
            .ok_or(Error::InvalidSecret("expected `whsec_` prefix"))?;
        let bytes = LENIENT_STANDARD
            .decode(encoded)
            .map_err(|_| Error::InvalidSecret("not valid standard base64"))?;
        if bytes.is_empty() {
            return Err(Error::InvalidSecret("empty key"));
        }
        Ok(Secret { bytes })
    }

    /// Wraps raw key bytes as a secret.
    pub fn from_bytes(bytes: Vec<u8>) -> Secret {
        Secret { bytes }
    }

    /// The raw HMAC key.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The wire form `whsec_<padded standard base64>`.
    pub fn to_whsec(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.bytes))
    }
}

// Keys must not leak into logs, so Debug is opaque and there is no Display.
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_does_not_reveal_the_key() {
        let secret = Secret::from_bytes(b"super secret".to_vec());
        assert_eq!(format!("{secret:?}"), "Secret(..)");
    }

    #[test]
    fn generated_secrets_are_32_random_bytes() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_eq!(a.as_bytes().len(), 32);
        assert_ne!(a.as_bytes(), b.as_bytes());
    }

    #[test]
    fn parse_accepts_padded_and_unpadded_base64() {
        let padded = Secret::parse("whsec_AAEC").unwrap();
        assert_eq!(padded.as_bytes(), &[0, 1, 2]);
        let padded = Secret::parse("whsec_AAECAw==").unwrap();
        let unpadded = Secret::parse("whsec_AAECAw").unwrap();
        assert_eq!(padded.as_bytes(), &[0, 1, 2, 3]);
        assert_eq!(unpadded.as_bytes(), padded.as_bytes());
    }

    #[test]
    fn parse_ignores_surrounding_whitespace() {
        let secret = Secret::parse("  whsec_AAECAw==\n").unwrap();
        assert_eq!(secret.as_bytes(), &[0, 1, 2, 3]);
    }

    #[test]
    fn parse_rejects_missing_prefix_empty_key_and_bad_base64() {
        for bad in [
            "",
            "AAECAw==",
            "whsec_",
            "whsec_!!!!",
            "whsec_AAECAw===",
            "whsec_AA EC",
        ] {
            assert!(
                matches!(Secret::parse(bad), Err(Error::InvalidSecret(_))),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn parse_errors_do_not_echo_the_secret() {
        let err = Secret::parse("whsec_c2VjcmV0!").unwrap_err();
        assert!(!err.to_string().contains("c2VjcmV0"));
    }

    #[test]
    fn to_whsec_uses_padded_standard_base64() {
        let secret = Secret::from_bytes(vec![0xfb, 0xff, 0x01, 0x02]);
        assert_eq!(secret.to_whsec(), "whsec_+/8BAg==");
    }
}
