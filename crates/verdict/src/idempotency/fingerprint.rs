//! The payload fingerprint: SHA-256 over the RFC 8785 canonical form of the JSON body, so a retry
//! that re-serialises with another key order or whitespace is the same payload.

use sha2::{Digest, Sha256};

/// SHA-256 of a body's canonical JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint(pub [u8; 32]);

/// The body could not be canonicalised (it is not JSON RFC 8785 can represent).
#[derive(Debug, thiserror::Error)]
#[error("the body cannot be put in canonical JSON form: {0}")]
pub struct FingerprintError(String);

impl Fingerprint {
    /// Fingerprints an already-parsed body.
    pub fn of(body: &serde_json::Value) -> Result<Self, FingerprintError> {
        Ok(Self(Sha256::digest(canonical(body)?).into()))
    }
}

/// RFC 8785 (JCS) serialisation.
pub fn canonical(value: &serde_json::Value) -> Result<Vec<u8>, FingerprintError> {
    serde_jcs::to_vec(value).map_err(|e| FingerprintError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn jcs(text: &str) -> String {
        let value: Value = serde_json::from_str(text).unwrap();
        String::from_utf8(canonical(&value).unwrap()).unwrap()
    }

    /// RFC 8785 §3.2.2 "Sample Input" and §3.2.3 "Sample Output".
    #[test]
    fn rfc8785_sample_canonicalises_as_published() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let expected = "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}";
        assert_eq!(jcs(input), expected);
    }

    /// RFC 8785 §3.2.3: properties sort by UTF-16 code units, not by UTF-8 bytes.
    #[test]
    fn rfc8785_property_sorting_example_orders_by_utf16() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let value: Value = serde_json::from_str(input).unwrap();
        let out = String::from_utf8(canonical(&value).unwrap()).unwrap();
        let keys: Vec<&str> = [
            "\r",
            "1",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
        ]
        .to_vec();
        let positions: Vec<usize> = keys
            .iter()
            .map(|k| {
                out.find(&format!("\"{}\":", k.replace('\r', "\\r")))
                    .unwrap()
            })
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{out}");
    }

    /// RFC 8785 Appendix B: IEEE 754 number serialisation samples.
    #[test]
    fn rfc8785_number_samples_serialise_as_published() {
        for (bits, expected) in [
            (0x0000000000000000u64, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ] {
            let value = json!(f64::from_bits(bits));
            assert_eq!(
                String::from_utf8(canonical(&value).unwrap()).unwrap(),
                expected,
                "{bits:#x}"
            );
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"c":[1,2],"d":"x"}}"#).unwrap();
        let b: Value =
            serde_json::from_str("{ \"b\" : { \"d\":\"x\", \"c\":[1, 2] },\n \"a\":1 }").unwrap();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1e15f64..1e15).prop_map(|n| json!(n)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("\\PC{0,8}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn canonical_form_is_a_fixed_point(value in arb_json()) {
            let once = canonical(&value).unwrap();
            let reparsed: Value = serde_json::from_slice(&once).unwrap();
            prop_assert_eq!(canonical(&reparsed).unwrap(), once);
        }

        #[test]
        fn pretty_printing_does_not_change_the_fingerprint(value in arb_json()) {
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            let reparsed: Value = serde_json::from_str(&pretty).unwrap();
            prop_assert_eq!(Fingerprint::of(&value).unwrap(), Fingerprint::of(&reparsed).unwrap());
        }
    }
}
