//! An identity-risk signal as a tenant sends it, validated before anything touches storage.

pub(crate) mod strict_json;

use serde::Deserialize;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

pub use crate::domain::SignalType;
use crate::secrets::Keyring;

/// Who the signal is about. Held only in memory: storage sees a keyed digest.
#[derive(Clone, PartialEq, Eq)]
pub enum Subject {
    Phone(String),
    Account(String),
    /// A subject known only by its tenant-scoped digest, as computed from a phone or account
    /// earlier (a registered CAMARA subscription's phone): deciding needs nothing more.
    Digested([u8; 32]),
}

impl Subject {
    /// The kind tag mixed into the subject digest.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Phone(_) => "phone",
            Self::Account(_) => "account",
            Self::Digested(_) => "digested",
        }
    }
}

/// The subject's keyed digest, scoped to the tenant so digests do not correlate across tenants;
/// a subject that is already a digest is that digest.
pub fn subject_digest(keys: &Keyring, tenant_id: Uuid, subject: &Subject) -> [u8; 32] {
    match subject {
        Subject::Digested(digest) => *digest,
        Subject::Phone(value) | Subject::Account(value) => keys.digest(&[
            b"subject",
            tenant_id.as_bytes(),
            subject.kind().as_bytes(),
            value.as_bytes(),
        ]),
    }
}

impl std::fmt::Debug for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Subject::{}(..)", self.kind())
    }
}

/// A signal that passed schema validation.
#[derive(Clone, Debug)]
pub struct Signal {
    pub signal_type: SignalType,
    pub subject: Subject,
    pub observed_at: OffsetDateTime,
    pub attributes: Map<String, Value>,
    pub metadata: Map<String, Value>,
}

/// Why a body is not a valid signal. The message names the field and the form it must have,
/// never the value sent (which may be a phone number).
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("the body is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("{0}")]
    Schema(String),
}

/// How far in the future `observed_at` may be: clocks drift, signals do not come from the
/// future. A later time would count as "recent" for as long as it stays ahead.
pub const MAX_OBSERVED_AHEAD: time::Duration = time::Duration::minutes(5);

/// The body of `POST /v1/signals`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SignalRequest)]
pub(crate) struct WireSignal {
    #[serde(rename = "type")]
    signal_type: SignalType,
    subject: WireSubject,
    /// When the signal was observed (RFC 3339).
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    observed_at: OffsetDateTime,
    /// Facts rules can match on, e.g. `swapped_at`, `to_carrier`, `severity`.
    #[serde(default)]
    #[schema(value_type = Object)]
    attributes: Map<String, Value>,
    /// Echoed untouched into the callback.
    #[serde(default)]
    #[schema(value_type = Object)]
    metadata: Map<String, Value>,
}

/// Exactly one of `phone` (E.164) or `account`; the other may be absent or `null`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireSubject {
    phone: Option<String>,
    account: Option<String>,
}

/// The documented form of [`WireSubject`], as [`Signal::parse`] checks it: `oneOf` a phone
/// subject and an account subject, each with its rule as a pattern.
impl utoipa::PartialSchema for WireSubject {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        let null = || ObjectBuilder::new().schema_type(Type::Null);
        let variant = |field: &str, other: &str, rule: ObjectBuilder| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .title(Some(field))
                .property(field, rule)
                .required(field)
                .property(other, null())
                .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::<
                    utoipa::openapi::schema::Schema,
                >::FreeForm(false)))
        };
        let phone = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(PHONE_FORM))
            .pattern(Some(PHONE_PATTERN));
        let account = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(ACCOUNT_FORM))
            .min_length(Some(1))
            .max_length(Some(MAX_ACCOUNT_LEN))
            .pattern(Some(ACCOUNT_PATTERN));
        OneOfBuilder::new()
            .description(Some(
                "Who the signal is about: exactly one of `phone` (E.164) or `account`.",
            ))
            .item(variant("phone", "account", phone))
            .item(variant("account", "phone", account))
            .into()
    }
}

impl utoipa::ToSchema for WireSubject {
    fn name() -> std::borrow::Cow<'static, str> {
        "Subject".into()
    }
}

/// [`validate_phone`] as an ECMA-262 pattern.
const PHONE_PATTERN: &str = r"^\+[1-9][0-9]{1,14}$";
/// No control character ([`char::is_control`]: C0, DEL and C1), as an ECMA-262 pattern.
const ACCOUNT_PATTERN: &str = r"^[^\u0000-\u001F\u007F-\u009F]*$";

/// Longest account identifier accepted.
const MAX_ACCOUNT_LEN: usize = 256;

impl Signal {
    /// Parses and validates a JSON body received at `now`, returning the generic JSON value
    /// too (for the fingerprint) so the body is parsed once.
    pub fn parse(body: &[u8], now: OffsetDateTime) -> Result<(Signal, Value), SignalError> {
        let value = strict_json::from_slice(body).map_err(SignalError::Json)?;
        let wire =
            serde_path_to_error::deserialize::<_, WireSignal>(&value).map_err(schema_error)?;
        if wire.observed_at > now + MAX_OBSERVED_AHEAD {
            return Err(SignalError::Schema(
                "`observed_at` must not be more than 5 minutes ahead of the server's clock".into(),
            ));
        }
        let subject = match (wire.subject.phone, wire.subject.account) {
            (Some(phone), None) => Subject::Phone(validate_phone(phone)?),
            (None, Some(account)) => Subject::Account(validate_account(account)?),
            _ => {
                return Err(SignalError::Schema(
                    "subject must have exactly one of `phone` or `account`".into(),
                ));
            }
        };
        let signal = Signal {
            signal_type: wire.signal_type,
            subject,
            observed_at: wire.observed_at,
            attributes: wire.attributes,
            metadata: wire.metadata,
        };
        Ok((signal, value))
    }
}

/// Names the field that failed and the form it must have; serde's own message is kept only
/// where it names nothing but our schema (a missing field), since it otherwise quotes the value.
fn schema_error(err: serde_path_to_error::Error<serde_json::Error>) -> SignalError {
    const FIELDS: &str = "`type`, `subject`, `observed_at`, `attributes` and `metadata`";
    let path = err.path().to_string();
    let cause = err.inner().to_string();
    let message = match path.as_str() {
        _ if cause.starts_with("missing field `") => {
            let field = cause.trim_start_matches("missing field ");
            format!("{field} is required")
        }
        "type" => "`type` must be one of `sim_swap`, `port_out` or `credential_breach`".into(),
        "subject" => "`subject` must be an object with exactly one of `phone` or `account`".into(),
        "subject.phone" => PHONE_FORM.into(),
        "subject.account" => ACCOUNT_FORM.into(),
        "observed_at" => {
            "`observed_at` must be an RFC 3339 date-time such as 2026-11-30T10:00:00Z".into()
        }
        "attributes" | "metadata" => format!("`{path}` must be a JSON object"),
        _ if path.starts_with("subject.") => "`subject` may only have `phone` or `account`".into(),
        _ if cause.starts_with("unknown field") => {
            format!("the body has a field a signal does not have; a signal has {FIELDS}")
        }
        _ => format!("the body must be a JSON object with {FIELDS}"),
    };
    SignalError::Schema(message)
}

const PHONE_FORM: &str =
    "`subject.phone` must be an E.164 number: `+` then 2 to 15 digits, not starting with 0";
const ACCOUNT_FORM: &str =
    "`subject.account` must be a string of 1 to 256 characters with no control characters";

/// E.164: a plus sign, then 2 to 15 digits, the first not zero.
/// A subject from exactly one of `phone` (E.164) or `account`, checked as a signal's is.
pub fn subject_of(phone: Option<String>, account: Option<String>) -> Result<Subject, SignalError> {
    match (phone, account) {
        (Some(phone), None) => Ok(Subject::Phone(validate_phone(phone)?)),
        (None, Some(account)) => Ok(Subject::Account(validate_account(account)?)),
        _ => Err(SignalError::Schema(
            "give exactly one of `phone` (E.164) or `account`".into(),
        )),
    }
}

pub(crate) fn validate_phone(phone: String) -> Result<String, SignalError> {
    let digits = phone.strip_prefix('+').unwrap_or("");
    let ok = (2..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0');
    if ok {
        Ok(phone)
    } else {
        // The message names the rule, never the value.
        Err(SignalError::Schema(PHONE_FORM.into()))
    }
}

pub(crate) fn validate_account(account: String) -> Result<String, SignalError> {
    if account.is_empty()
        || account.chars().count() > MAX_ACCOUNT_LEN
        || account.chars().any(char::is_control)
    {
        return Err(SignalError::Schema(ACCOUNT_FORM.into()));
    }
    Ok(account)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn parse(text: &str) -> Result<Signal, SignalError> {
        Signal::parse(
            text.as_bytes(),
            time::macros::datetime!(2026-11-30 12:00 UTC),
        )
        .map(|(s, _)| s)
    }

    #[test]
    fn a_well_formed_sim_swap_parses() {
        let signal = parse(
            r#"{"type":"sim_swap","subject":{"phone":"+447700900123"},
                "observed_at":"2026-11-30T10:00:00Z","attributes":{"carrier":"x"},
                "metadata":{"ref":1}}"#,
        )
        .unwrap();
        assert_eq!(signal.signal_type, SignalType::SimSwap);
        assert_eq!(signal.subject, Subject::Phone("+447700900123".into()));
        assert_eq!(signal.metadata["ref"], 1);
    }

    #[test]
    fn subject_needs_exactly_one_identifier() {
        for subject in [r#"{}"#, r#"{"phone":"+15551234567","account":"a"}"#] {
            let body = format!(
                r#"{{"type":"port_out","subject":{subject},"observed_at":"2026-11-30T10:00:00Z"}}"#
            );
            assert!(parse(&body).is_err(), "{body}");
        }
    }

    #[test]
    fn phone_that_is_not_e164_is_refused_without_echoing_it() {
        let body = r#"{"type":"sim_swap","subject":{"phone":"07700900123"},"observed_at":"2026-11-30T10:00:00Z"}"#;
        let err = parse(body).unwrap_err().to_string();
        assert!(!err.contains("07700900123"), "{err}");
    }

    #[test]
    fn unknown_fields_and_types_are_refused() {
        assert!(parse(r#"{"type":"sim_swap","subject":{"account":"a"},"observed_at":"2026-11-30T10:00:00Z","extra":1}"#).is_err());
        assert!(parse(r#"{"type":"weather","subject":{"account":"a"},"observed_at":"2026-11-30T10:00:00Z"}"#).is_err());
        assert!(
            parse(r#"{"type":"sim_swap","subject":{"account":"a"},"observed_at":"yesterday"}"#)
                .is_err()
        );
    }

    #[test]
    fn errors_name_the_field_and_never_echo_the_value() {
        let secret = "+447700900123";
        let base = json!({"type":"sim_swap","subject":{"phone":"+15551234567"},"observed_at":"2026-11-30T10:00:00Z"});
        let cases: Vec<(Value, &str)> = vec![
            (json!({"type": secret}), "`type`"),
            (json!({"subject": secret}), "`subject`"),
            (
                json!({"subject": {"phone": 447700900123u64}}),
                "`subject.phone`",
            ),
            (
                json!({"subject": {"account": [secret]}}),
                "`subject.account`",
            ),
            (
                json!({"subject": {"phone": "+15551234567", secret: 1}}),
                "`subject`",
            ),
            (json!({"observed_at": secret}), "`observed_at`"),
            (json!({"attributes": secret}), "`attributes`"),
            (json!({"metadata": [secret]}), "`metadata`"),
            (json!({secret: 1}), "a signal has `type`"),
        ];
        for (patch, names) in cases {
            let mut body = base.clone();
            for (k, v) in patch.as_object().unwrap() {
                body[k] = v.clone();
            }
            let err = parse(&body.to_string()).unwrap_err().to_string();
            assert!(err.contains(names), "{body}: {err}");
            assert!(!err.contains("447700900123"), "{body}: {err}");
        }
        let missing = parse(r#"{"type":"sim_swap","subject":{"account":"a"}}"#).unwrap_err();
        assert_eq!(missing.to_string(), "`observed_at` is required");
    }

    #[test]
    fn duplicate_member_names_are_a_json_error() {
        let body = r#"{"type":"sim_swap","subject":{"phone":"+15551234567","phone":"+15557654321"},"observed_at":"2026-11-30T10:00:00Z"}"#;
        assert!(matches!(parse(body), Err(SignalError::Json(_))));
    }

    #[test]
    fn observed_at_more_than_5_minutes_ahead_is_refused() {
        let at = |t: &str| {
            parse(&format!(
                r#"{{"type":"sim_swap","subject":{{"account":"a"}},"observed_at":"{t}"}}"#
            ))
        };
        assert!(at("2026-11-30T12:04:59Z").is_ok());
        assert!(at("2026-11-30T12:05:01Z").is_err());
        let far = at("9999-12-31T23:59:59Z").unwrap_err().to_string();
        assert!(far.contains("5 minutes"), "{far}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Signal::parse(&body, OffsetDateTime::now_utc());
        }

        #[test]
        fn accepted_phones_are_e164(phone in "\\+?[0-9]{0,17}") {
            if let Ok(p) = validate_phone(phone.clone()) {
                prop_assert!(p.starts_with('+') && p.len() >= 3 && p.len() <= 16);
                prop_assert!(!p[1..].starts_with('0'));
            }
        }
    }
}
