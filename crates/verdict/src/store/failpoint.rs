//! Named failpoints between ingest phases, and one inside the pruner's event batch, compiled in
//! only with the `failpoints` feature.
//!
//! Configure with `FAILPOINTS="ingest::after_claim=return(abort)"` (the `fail` crate's syntax):
//! - `return(abort)` aborts the process on the spot, as a crash would;
//! - `return(delay_ms=N)` holds the request N ms without blocking the runtime (the crate's own
//!   `sleep` would block a worker thread and stall unrelated requests);
//! - `return` alone fails the request as if the database had gone away;
//! - `return(permanent)` fails it as a corrupt row would, a failure that is not transient.
//!
//! A count prefix limits how often a point fires, e.g. `1*return`.

/// Marks a point where tests may inject a crash, a transient failure or a delay.
macro_rules! failpoint {
    ($name:expr) => {
        #[cfg(feature = "failpoints")]
        if let Some(arg) = fail::eval($name, |arg| arg) {
            match crate::store::failpoint::Injected::from(arg) {
                crate::store::failpoint::Injected::Abort => std::process::abort(),
                crate::store::failpoint::Injected::Delay(pause) => tokio::time::sleep(pause).await,
                crate::store::failpoint::Injected::Fail => {
                    return Err(
                        crate::store::StoreError::Unavailable(sqlx::Error::PoolTimedOut).into(),
                    );
                }
                crate::store::failpoint::Injected::Permanent => {
                    return Err(crate::store::StoreError::Corrupt("injected".into()).into());
                }
            }
        }
    };
}
pub(crate) use failpoint;

/// What a configured failpoint asks for.
#[cfg(feature = "failpoints")]
pub(crate) enum Injected {
    Abort,
    Delay(std::time::Duration),
    Fail,
    Permanent,
}

#[cfg(feature = "failpoints")]
impl From<Option<String>> for Injected {
    fn from(arg: Option<String>) -> Self {
        match arg.as_deref() {
            Some("abort") => Self::Abort,
            Some("permanent") => Self::Permanent,
            Some(other) => match other.strip_prefix("delay_ms=").map(str::parse) {
                Some(Ok(ms)) => Self::Delay(std::time::Duration::from_millis(ms)),
                _ => Self::Fail,
            },
            None => Self::Fail,
        }
    }
}

/// The failpoint after an action, named `act::after_<action>` after its wire name.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) fn after_action(action: crate::domain::ActionKind) -> String {
    format!("act::after_{}", action.as_str())
}

/// The error PostgreSQL reports when it breaks a deadlock (SQLSTATE 40P01), for the
/// `group_commit::conflict` failpoint.
#[cfg(feature = "failpoints")]
#[derive(Debug)]
pub(crate) struct InjectedDeadlock;

#[cfg(feature = "failpoints")]
impl InjectedDeadlock {
    const MESSAGE: &str = "deadlock detected (injected)";
}

#[cfg(feature = "failpoints")]
impl std::fmt::Display for InjectedDeadlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(Self::MESSAGE)
    }
}

#[cfg(feature = "failpoints")]
impl std::error::Error for InjectedDeadlock {}

#[cfg(feature = "failpoints")]
impl sqlx::error::DatabaseError for InjectedDeadlock {
    fn message(&self) -> &str {
        Self::MESSAGE
    }

    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some("40P01".into())
    }

    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}
