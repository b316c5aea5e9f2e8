//! Storage: one trait, two real backends (SQLite embedded, PostgreSQL shared).
//!
//! Both use the database's own uniqueness check to decide races: a claim is one
//! `INSERT … ON CONFLICT DO NOTHING RETURNING`, a takeover one compare-and-set `UPDATE`.
//! Times are unix milliseconds; identifiers only ever arrive here as keyed digests.

// `sql` first: its `sql_store!` macro is used by the backends declared after it.
#[macro_use]
mod sql;
mod postgres;
mod sqlite;

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use crate::actions::Applied;

pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Errors from storage; `is_transient` tells a retry from a final failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the database is unreachable or busy")]
    Unavailable(#[source] sqlx::Error),
    #[error("another request took over this idempotency key")]
    LockLost,
    #[error("database error")]
    Database(#[source] sqlx::Error),
    #[error("migrations failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("a stored record is malformed: {0}")]
    Corrupt(String),
    #[error("unsupported database URL (expected sqlite://PATH or postgres://…)")]
    UnsupportedUrl,
}

impl StoreError {
    /// A transient failure leaves work at its last recovery point for a retry to resume.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::LockLost)
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &err {
            E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => {
                Self::Unavailable(err)
            }
            // SQLITE_BUSY / SQLITE_LOCKED, and PostgreSQL's serialization, deadlock, connection
            // and shutdown classes: the same statement may well succeed on retry.
            E::Database(db) => match db.code().as_deref() {
                Some("5" | "6" | "517" | "40001" | "40P01" | "57P01" | "57P02" | "57P03") => {
                    Self::Unavailable(err)
                }
                Some(code) if code.starts_with("08") => Self::Unavailable(err),
                _ => Self::Database(err),
            },
            _ => Self::Database(err),
        }
    }
}

/// Which secret of a tenant's a row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretPurpose {
    /// Verifies `Verdict-Signature` on inbound signals.
    Inbound,
    /// Signs outbound callbacks.
    Webhook,
}

impl SecretPurpose {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inbound => "inbound",
            Self::Webhook => "webhook",
        }
    }
}

/// A tenant to insert.
#[derive(Clone, Debug)]
pub struct NewTenant {
    pub id: Uuid,
    pub name: String,
    pub api_key_hash: Vec<u8>,
    pub inbound_signature_required: bool,
    pub callback_url: Option<String>,
    pub created_at: i64,
}

/// A tenant as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantRecord {
    pub id: Uuid,
    pub name: String,
    pub inbound_signature_required: bool,
    pub callback_url: Option<String>,
    pub callback_disabled: bool,
}

/// A signing secret sealed under the master key.
#[derive(Clone, Debug)]
pub struct SealedSecret {
    pub id: Uuid,
    pub purpose: SecretPurpose,
    pub sealed: Vec<u8>,
    pub created_at: i64,
}

/// The primary key of an idempotency row.
#[derive(Clone, Debug)]
pub struct KeyRef {
    pub tenant_id: Uuid,
    pub endpoint: &'static str,
    pub digest: Vec<u8>,
}

/// A request to claim a key, with the lock it takes if it wins.
#[derive(Clone, Debug)]
pub struct Claim {
    pub key: KeyRef,
    pub fingerprint: Vec<u8>,
    pub event_id: Uuid,
    pub lock_token: Uuid,
    pub now: i64,
    pub locked_until: i64,
    pub expires_at: i64,
}

/// A response stored on a completed key, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Where a taken-over row stood when its holder died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryPoint {
    /// Nothing recorded yet: process from the start.
    InFlight,
    /// Actions ran; their results (JSON) are all persistence needs.
    Dispatched { action_results: String },
}

/// What a claim found; each arm is the handler's next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// We inserted the row: process from the start with our event id.
    Started,
    /// The holder's lock had expired and we took the row over.
    TakenOver { event_id: Uuid, from: RecoveryPoint },
    /// Someone holds a fresh lock: 409.
    InProgress,
    /// The key was used with another payload: 422.
    Mismatch,
    /// Completed earlier: replay; the row stays as it is until `expires_at`.
    Completed {
        response: StoredResponse,
        expires_at: i64,
    },
}

/// An event (the signal without raw identifiers, and its decision) to persist.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub signal_type: &'static str,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    pub metadata: String,
    pub decision: &'static str,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: String,
    pub created_at: i64,
}

/// The last step of a request: the event (if one was decided) and the response, with the key
/// (if any) moved to `completed` in the same transaction.
#[derive(Clone, Debug)]
pub struct Completion {
    pub event: Option<NewEvent>,
    pub key: Option<(KeyRef, Uuid)>,
    pub response: StoredResponse,
}

/// Who an action is about and which event applies it.
#[derive(Clone, Debug)]
pub struct ActionTarget {
    pub tenant_id: Uuid,
    pub event_id: Uuid,
    pub subject_hash: Vec<u8>,
    /// Digest of (subject, type, observed_at): the same signal under any key or none.
    pub signal_key: Vec<u8>,
    pub signal_type: &'static str,
    pub now: i64,
}

/// A callback to record in the outbox; the envelope is built once, here.
#[derive(Clone, Debug)]
pub struct NewDelivery {
    pub id: Uuid,
    pub webhook_id: String,
    pub payload: Vec<u8>,
    /// Reserved for the inline attempt until then; if the process dies, the worker takes it.
    pub leased_until: i64,
}

/// A delivery leased for an attempt, with where it goes.
#[derive(Clone, Debug)]
pub struct DueDelivery {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub webhook_id: String,
    pub payload: Vec<u8>,
    pub retries_left: i64,
    pub callback_url: Option<String>,
}

/// One attempt and the delivery's state after it, recorded together.
#[derive(Clone, Debug)]
pub struct AttemptRecord {
    pub id: Uuid,
    pub delivery_id: Uuid,
    pub tenant_id: Uuid,
    pub attempted_at: i64,
    pub trigger: &'static str,
    pub status_code: Option<i32>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<Vec<u8>>,
    pub next: crate::delivery::schedule::Next,
}

/// An attempt as read back.
#[derive(Clone, Debug)]
pub struct AttemptRow {
    pub attempted_at: i64,
    pub trigger: String,
    pub status_code: Option<i32>,
    pub latency_ms: i64,
    pub error: Option<String>,
    pub response_excerpt: Option<Vec<u8>>,
}

/// What the recovery point stores once the callback's outcome is known.
pub struct Recorded {
    /// The decision record (JSON), stored on the key of a keyed request.
    pub record: String,
    /// The event itself, for a request without a key: with no key row to resume from, the event
    /// is stored in this same transaction so no callback can outlive a missing event.
    pub event: Option<NewEvent>,
}

/// The recovery point: the decision record (or, without a key, the event), stored with the
/// callback's outbox row in one transaction.
pub struct Dispatch<'a> {
    pub target: &'a ActionTarget,
    /// The held key, if the request has one.
    pub key: Option<(&'a KeyRef, Uuid)>,
    /// The callback to record, if the decision asks for one.
    pub callback: Option<&'a NewDelivery>,
    /// Builds what is stored once the callback's outcome is known.
    pub record: &'a (dyn Fn(Option<Applied>) -> Recorded + Send + Sync),
}

/// A playbook document as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredPlaybook {
    pub version: i64,
    pub format: String,
    pub source: String,
    pub created_at: i64,
}

/// An event as read back.
#[derive(Clone, Debug)]
pub struct EventRecord {
    pub id: Uuid,
    pub signal_type: String,
    pub subject_hash: Vec<u8>,
    pub observed_at: i64,
    pub attributes: String,
    pub metadata: String,
    pub decision: String,
    pub playbook_version: i64,
    pub rule: String,
    pub actions: String,
    pub created_at: i64,
}

/// A callback delivery as read back.
#[derive(Clone, Debug)]
pub struct DeliveryRecord {
    pub id: Uuid,
    pub event_id: Uuid,
    pub webhook_id: String,
    pub status: crate::delivery::DeliveryStatus,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What currently stands against a subject.
#[derive(Clone, Debug, Default)]
pub struct SubjectState {
    /// The event that locked the account, and when.
    pub lock: Option<(Uuid, i64)>,
    /// Open cases: id, opening time, attached events.
    pub open_cases: Vec<(Uuid, i64, Vec<Uuid>)>,
    /// The event that issued the standing deny, and when.
    pub deny: Option<(Uuid, i64)>,
}

/// Everything verdict stores, whichever database holds it.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// One round trip, for readiness.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Inserts a tenant and its first secrets in one transaction.
    async fn create_tenant(
        &self,
        tenant: &NewTenant,
        secrets: &[SealedSecret],
    ) -> Result<(), StoreError>;
    /// The tenant whose API key hashes to `hash`.
    async fn tenant_by_api_key(&self, hash: &[u8]) -> Result<Option<TenantRecord>, StoreError>;
    /// A tenant by id.
    async fn tenant(&self, id: Uuid) -> Result<Option<TenantRecord>, StoreError>;
    /// Secrets of a purpose that are valid at `now`, newest first.
    async fn live_secrets(
        &self,
        tenant_id: Uuid,
        purpose: SecretPurpose,
        now: i64,
    ) -> Result<Vec<SealedSecret>, StoreError>;
    /// Adds `secret` and retires the tenant's current secrets of its purpose at `retire_at`.
    async fn rotate_secret(
        &self,
        tenant_id: Uuid,
        secret: &SealedSecret,
        retire_at: i64,
    ) -> Result<(), StoreError>;

    /// Claims an idempotency key, or reports what holds it.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError>;
    /// Records the callback (if any) in the outbox and, in the same transaction, stores the
    /// decision record on the key (moving it to `dispatched`) or, without a key, the event.
    /// Returns the callback's outcome.
    async fn dispatch(&self, dispatch: &Dispatch<'_>) -> Result<Option<Applied>, StoreError>;
    /// Persists the event and the response and completes the key, in one transaction.
    async fn complete(&self, completion: &Completion) -> Result<(), StoreError>;
    /// Releases our lock, leaving the row at its last recovery point.
    async fn release(&self, key: &KeyRef, lock_token: Uuid) -> Result<(), StoreError>;
    /// Deletes keys whose lifetime ended; returns how many.
    async fn prune_expired_keys(&self, now: i64) -> Result<u64, StoreError>;

    /// The tenant's newest playbook, if it uploaded one.
    async fn current_playbook(&self, tenant_id: Uuid)
    -> Result<Option<StoredPlaybook>, StoreError>;
    /// Stores a validated playbook as the next version; returns that version.
    async fn put_playbook(
        &self,
        tenant_id: Uuid,
        format: &str,
        source: &str,
        now: i64,
    ) -> Result<i64, StoreError>;

    /// Whether the subject's account is locked.
    async fn subject_locked(
        &self,
        tenant_id: Uuid,
        subject_hash: &[u8],
    ) -> Result<bool, StoreError>;
    /// Locks the subject's account unless it is locked.
    async fn lock_account(&self, target: &ActionTarget) -> Result<Applied, StoreError>;
    /// Opens a case for the subject, or attaches the event to its open case.
    async fn open_case(&self, target: &ActionTarget) -> Result<Applied, StoreError>;
    /// Records a customer alert unless one went out for this subject and type within `window_ms`.
    async fn alert_customer(
        &self,
        target: &ActionTarget,
        window_ms: i64,
    ) -> Result<Applied, StoreError>;
    /// Adds a step-up ledger entry unless this event or this signal already has one.
    async fn charge_step_up(&self, target: &ActionTarget) -> Result<Applied, StoreError>;
    /// Issues a deny for the subject unless one stands.
    async fn deny_subject(&self, target: &ActionTarget) -> Result<Applied, StoreError>;

    /// The tenant's events, newest first, older than `before` when given.
    async fn events(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<EventRecord>, StoreError>;
    /// One of the tenant's events.
    async fn event(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<EventRecord>, StoreError>;
    /// The deliveries of one of the tenant's events.
    async fn deliveries_for_event(
        &self,
        tenant_id: Uuid,
        event_id: Uuid,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// Locks, open cases and the standing deny of a subject; `None` if the tenant has no event
    /// about it.
    async fn subject(
        &self,
        tenant_id: Uuid,
        subject_hash: &[u8],
    ) -> Result<Option<SubjectState>, StoreError>;

    /// Leases up to `limit` deliveries due at `now`, and not attempted (nor otherwise updated)
    /// at or after `since`, until `lease_until`; no two callers get the same delivery.
    async fn lease_due(
        &self,
        now: i64,
        since: i64,
        lease_until: i64,
        limit: i64,
    ) -> Result<Vec<DueDelivery>, StoreError>;
    /// Records an attempt and moves the delivery to its next state, in one transaction (and
    /// disables the tenant's endpoint after a 410).
    async fn record_attempt(&self, attempt: &AttemptRecord) -> Result<(), StoreError>;
    /// Gives one of the tenant's deliveries a fresh retry budget and leases it, unless it is
    /// leased now or the endpoint is disabled.
    async fn lease_for_redelivery(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        now: i64,
        lease_until: i64,
        retries: i64,
    ) -> Result<Option<DueDelivery>, StoreError>;
    /// The tenant's deliveries, newest first, optionally of one status.
    async fn deliveries(
        &self,
        tenant_id: Uuid,
        status: Option<crate::delivery::DeliveryStatus>,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;
    /// One of the tenant's deliveries.
    async fn delivery(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Option<DeliveryRecord>, StoreError>;
    /// A delivery's attempts, oldest first.
    async fn delivery_attempts(&self, delivery_id: Uuid) -> Result<Vec<AttemptRow>, StoreError>;
    /// Sets the tenant's callback URL and re-enables its endpoint; false if no such tenant.
    async fn set_callback(&self, tenant_id: Uuid, url: Option<&str>) -> Result<bool, StoreError>;
    /// Deliveries waiting for an attempt.
    async fn queue_depth(&self, now: i64) -> Result<i64, StoreError>;
}

/// Opens the backend a URL names and runs its migrations.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    let store: Arc<dyn Store> = if url.starts_with("sqlite:") {
        Arc::new(SqliteStore::connect(url).await?)
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Arc::new(PostgresStore::connect(url).await?)
    } else {
        return Err(StoreError::UnsupportedUrl);
    };
    store.migrate().await?;
    Ok(store)
}

/// The file a `sqlite:` URL points at, if any (for placing the master key beside it).
pub fn sqlite_path(url: &str) -> Option<std::path::PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| path.into())
}

/// An existing key row, as a claim that lost the insert reads it.
#[derive(Clone, Debug)]
pub(crate) struct ExistingKey {
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) state: String,
    pub(crate) event_id: Uuid,
    pub(crate) locked_until: i64,
    pub(crate) action_results: Option<String>,
    pub(crate) response_status: Option<i32>,
    pub(crate) response_body: Option<Vec<u8>>,
    pub(crate) expires_at: i64,
}

/// What to do about a row a claim found; shared by both backends so they judge alike.
pub(crate) enum Judgement {
    /// The row outlived its key lifetime: delete it and insert afresh.
    Expired,
    /// The answer is known without another statement.
    Final(ClaimOutcome),
    /// The holder's lock expired: compare-and-set it, then resume from here.
    TakeOver(RecoveryPoint),
}

pub(crate) fn judge(row: ExistingKey, claim: &Claim) -> Judgement {
    if row.expires_at <= claim.now {
        return Judgement::Expired;
    }
    if row.fingerprint != claim.fingerprint {
        return Judgement::Final(ClaimOutcome::Mismatch);
    }
    match (row.state.as_str(), row.response_status, row.response_body) {
        ("completed", Some(status), Some(body)) => Judgement::Final(ClaimOutcome::Completed {
            response: StoredResponse {
                status: u16::try_from(status).unwrap_or(500),
                body,
            },
            expires_at: row.expires_at,
        }),
        _ if row.locked_until > claim.now => Judgement::Final(ClaimOutcome::InProgress),
        ("dispatched", _, _) => Judgement::TakeOver(RecoveryPoint::Dispatched {
            action_results: row.action_results.unwrap_or_else(|| "[]".into()),
        }),
        _ => Judgement::TakeOver(RecoveryPoint::InFlight),
    }
}

/// How many times a claim retries after finding an expired row deleted under it.
pub(crate) const CLAIM_ATTEMPTS: usize = 3;
