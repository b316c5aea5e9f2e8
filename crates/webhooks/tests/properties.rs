//! Property tests of signing, verification and secret encoding.

use proptest::prelude::*;
use verdict_webhooks::{Headers, Secret, Verifier, VerifyError, signature_matches, signed_headers};

fn secret() -> impl Strategy<Value = Secret> {
    proptest::collection::vec(any::<u8>(), 1..64).prop_map(Secret::from_bytes)
}

proptest! {
    #[test]
    fn signing_then_verifying_round_trips(
        secret in secret(),
        id in "\\PC{1,40}",
        timestamp in any::<i64>(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let sent = signed_headers(std::slice::from_ref(&secret), &id, timestamp, &body);
        let headers = Headers { id: &sent[0].1, timestamp: &sent[1].1, signature: &sent[2].1 };
        let verifier = Verifier::new(vec![secret]);
        prop_assert_eq!(verifier.verify(&headers, &body, timestamp), Ok(timestamp));
    }

    #[test]
    fn any_single_byte_change_to_the_body_fails_verification(
        secret in secret(),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        index in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let (id, timestamp) = ("msg_prop", 1_700_000_000);
        let signature = secret.sign(id, timestamp, &body);
        let mut tampered = body.clone();
        let i = index.index(tampered.len());
        tampered[i] ^= flip;
        let headers = Headers { id, timestamp: "1700000000", signature: &signature };
        let verifier = Verifier::new(vec![secret]);
        prop_assert_eq!(
            verifier.verify(&headers, &tampered, timestamp),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn a_secret_round_trips_through_its_whsec_form(secret in secret()) {
        let parsed = Secret::parse(&secret.to_whsec()).expect("own encoding parses");
        prop_assert_eq!(parsed.as_bytes(), secret.as_bytes());
    }

    #[test]
    fn signature_matches_never_panics_on_arbitrary_headers(
        secret in secret(),
        content in proptest::collection::vec(any::<u8>(), 0..64),
        header in "\\PC*|(v1,[A-Za-z0-9+/=]{0,60}[ ,]{0,3}){0,4}",
    ) {
        let _ = signature_matches(&[secret], &content, &header);
    }

    #[test]
    fn arbitrary_headers_never_verify_or_panic(
        secret in secret(),
        id in "\\PC*",
        timestamp in "\\PC*|-?[0-9]{1,20}",
        signature in "\\PC*",
        body in proptest::collection::vec(any::<u8>(), 0..64),
        now in any::<i64>(),
    ) {
        let headers = Headers { id: &id, timestamp: &timestamp, signature: &signature };
        prop_assert!(Verifier::new(vec![secret]).verify(&headers, &body, now).is_err());
    }
}
