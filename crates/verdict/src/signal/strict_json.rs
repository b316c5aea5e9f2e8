//! JSON parsing that refuses duplicate member names at any depth.
//!
//! `serde_json` keeps the last of two equal names, so `{"phone":"A","phone":"B"}` would be
//! decided on `B` while a proxy or log that keeps the first saw `A`. RFC 8259 leaves duplicates
//! to the parser; we refuse them.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `bytes` as one JSON value, refusing a repeated member name in any object.
pub fn from_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictValue.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Builds a [`Value`] like `serde_json` does, but fails on a repeated member name.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element_seed(StrictValue)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                // The name is the sender's; the message does not repeat it.
                return Err(de::Error::custom(
                    "an object has the same member name twice",
                ));
            }
            let value = map.next_value_seed(StrictValue)?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn duplicate_member_names_are_refused_at_any_depth() {
        for text in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":{"b":1,"b":1}}"#,
            r#"[{"x":[{"y":1,"y":2}]}]"#,
            r#"{"a":1,"\u0061":2}"#,
        ] {
            let err = from_slice(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains("same member name twice"), "{text}: {err}");
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        assert!(from_slice(br#"{"a":1} {"a":2}"#).is_err());
    }

    #[test]
    fn equal_names_in_sibling_objects_are_fine() {
        let value = from_slice(br#"{"a":{"x":1},"b":{"x":2},"c":[{"x":3},{"x":4}]}"#).unwrap();
        assert_eq!(value["c"][1]["x"], 4);
    }

    proptest! {
        /// On any document without duplicates the strict parser agrees with `serde_json`.
        #[test]
        fn agrees_with_serde_json_on_documents_without_duplicates(
            value in arbitrary_json(),
        ) {
            let text = serde_json::to_vec(&value).unwrap();
            prop_assert_eq!(from_slice(&text).unwrap(), serde_json::from_slice::<Value>(&text).unwrap());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = from_slice(&bytes);
        }
    }

    fn arbitrary_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| Value::Number(n.into())),
            (-1e9f64..1e9).prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{0,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }
}
