//! An identity-risk signal as a tenant sends it, validated before anything touches storage.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;

/// The kinds of identity-risk signal verdict understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SignalType {
    SimSwap,
    PortOut,
    CredentialBreach,
}

impl SignalType {
    /// The wire name, as stored and sent in callbacks.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SimSwap => "sim_swap",
            Self::PortOut => "port_out",
            Self::CredentialBreach => "credential_breach",
        }
    }
}

/// Who the signal is about. Held only in memory: storage sees a keyed digest.
#[derive(Clone, PartialEq, Eq)]
pub enum Subject {
    Phone(String),
    Account(String),
}

impl Subject {
    /// The kind tag mixed into the subject digest.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Phone(_) => "phone",
            Self::Account(_) => "account",
        }
    }

    /// The raw identifier, for digesting only.
    pub fn value(&self) -> &str {
        match self {
            Self::Phone(v) | Self::Account(v) => v,
        }
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

/// Why a body is not a valid signal; the message is safe to show the sender.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("the body is not valid JSON: {0}")]
    Json(String),
    #[error("{0}")]
    Schema(String),
}

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

/// Exactly one of `phone` (E.164) or `account`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Subject)]
pub(crate) struct WireSubject {
    phone: Option<String>,
    account: Option<String>,
}

/// Longest account identifier accepted.
const MAX_ACCOUNT_LEN: usize = 256;

impl Signal {
    /// Parses and validates a JSON body, returning the generic JSON value too (for the
    /// fingerprint) so the body is parsed once.
    pub fn parse(body: &[u8]) -> Result<(Signal, Value), SignalError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| SignalError::Json(e.to_string()))?;
        let wire =
            WireSignal::deserialize(&value).map_err(|e| SignalError::Schema(e.to_string()))?;
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

/// E.164: a plus sign, then 2 to 15 digits, the first not zero.
fn validate_phone(phone: String) -> Result<String, SignalError> {
    let digits = phone.strip_prefix('+').unwrap_or("");
    let ok = (2..=15).contains(&digits.len())
        && digits.bytes().all(|b| b.is_ascii_digit())
        && !digits.starts_with('0');
    if ok {
        Ok(phone)
    } else {
        // The message names the rule, never the value.
        Err(SignalError::Schema(
            "subject.phone must be an E.164 number: `+` then 2 to 15 digits, not starting with 0"
                .into(),
        ))
    }
}

fn validate_account(account: String) -> Result<String, SignalError> {
    if account.is_empty()
        || account.chars().count() > MAX_ACCOUNT_LEN
        || account.chars().any(char::is_control)
    {
        return Err(SignalError::Schema(format!(
            "subject.account must be 1 to {MAX_ACCOUNT_LEN} characters with no control characters"
        )));
    }
    Ok(account)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Result<Signal, SignalError> {
        Signal::parse(text.as_bytes()).map(|(s, _)| s)
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

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = Signal::parse(&body);
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
