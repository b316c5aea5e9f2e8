//! Why an operator did something, for the record: the way back's reason and an unknown
//! outcome's resolution both carry one.

/// The longest reason accepted, in characters.
pub const MAX_REASON_CHARS: usize = 500;

/// A reason that passed its check: 1 to [`MAX_REASON_CHARS`] characters, not all blank, no
/// control character but a newline or a tab (PostgreSQL refuses NUL in text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason(String);

/// A reason that is empty, blank or too long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`reason` must be 1 to {MAX_REASON_CHARS} characters, saying why, with no control \
     character but a newline or a tab"
)]
pub struct InvalidReason;

impl Reason {
    /// Checks `text`.
    pub fn parse(text: &str) -> Result<Self, InvalidReason> {
        if text.trim().is_empty()
            || text.chars().count() > MAX_REASON_CHARS
            || text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t')
        {
            return Err(InvalidReason);
        }
        Ok(Self(text.to_owned()))
    }

    /// The reason as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<&str> for Reason {
    type Error = InvalidReason;

    fn try_from(text: &str) -> Result<Self, InvalidReason> {
        Self::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_is_one_to_five_hundred_characters_not_all_blank() {
        assert!(Reason::parse("x").is_ok());
        assert!(Reason::parse(&"é".repeat(MAX_REASON_CHARS)).is_ok());
        assert_eq!(
            Reason::parse(&"x".repeat(MAX_REASON_CHARS + 1)),
            Err(InvalidReason)
        );
        for blank in ["", " ", "\n\t "] {
            assert_eq!(Reason::parse(blank), Err(InvalidReason), "{blank:?}");
        }
        assert!(Reason::parse("called back\n\tverified").is_ok());
        for control in ["x\0", "x\u{7f}", "x\u{1b}[2J", "x\r", "x\u{85}"] {
            assert_eq!(Reason::parse(control), Err(InvalidReason), "{control:?}");
        }
    }
}
