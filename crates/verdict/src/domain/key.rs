//! Where an idempotency key stands.

use std::str::FromStr;

/// Where a key stands; the recovery points of the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// Claimed; the decision is recorded on the row, and no effect of it is stored yet.
    InFlight,
    /// Effects, event and the connectors' action requests stored, the calls outstanding (the
    /// recovery point before any call): completed when they answer; a retry that takes it
    /// over calls again with the same bytes and key, never anew. (v1 of the pipeline also
    /// wrote it, committing effects before the event.)
    Dispatched,
    /// Effects, outbox row, event and response stored together: replayed until expiry.
    Completed,
}

impl KeyState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Dispatched => "dispatched",
            Self::Completed => "completed",
        }
    }
}

impl FromStr for KeyState {
    type Err = UnknownKeyState;

    fn from_str(s: &str) -> Result<Self, UnknownKeyState> {
        match s {
            "in_flight" => Ok(Self::InFlight),
            "dispatched" => Ok(Self::Dispatched),
            "completed" => Ok(Self::Completed),
            other => Err(UnknownKeyState(other.to_owned())),
        }
    }
}

/// A stored name that is no key state's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown key state `{0}`")]
pub struct UnknownKeyState(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_state_reads_back_from_its_name() {
        for state in [
            KeyState::InFlight,
            KeyState::Dispatched,
            KeyState::Completed,
        ] {
            assert_eq!(state.as_str().parse::<KeyState>(), Ok(state));
        }
        assert!("nope".parse::<KeyState>().is_err());
    }
}
