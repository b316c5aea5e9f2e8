//! Playbook versions, and the one read a decision needs before its claim.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};

/// A playbook document as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct StoredPlaybook {
    pub version: i64,
    pub format: String,
    pub source: String,
    pub created_at: i64,
}

/// A row of the batched decision read: which (tenant, subject) it answers, and one of the
/// tenant's endpoints (a row per endpoint; none for a tenant without one).
#[derive(sqlx::FromRow)]
pub(crate) struct DecisionInputsRow {
    tenant_id: Uuid,
    subject_hash: Vec<u8>,
    playbook_version: Option<i64>,
    subject_locked: bool,
    endpoint_id: Option<Uuid>,
    endpoint_name: Option<String>,
    endpoint_url: Option<String>,
    endpoint_secret: Option<Vec<u8>>,
    signal_types: Option<String>,
    decisions: Option<String>,
    feeds: Option<String>,
    endpoint_disabled: Option<bool>,
}

impl DecisionInputsRow {
    /// The endpoint this row carries, if any.
    fn endpoint(&mut self) -> Result<Option<EndpointTarget>, crate::store::StoreError> {
        let (Some(id), Some(name), Some(url)) = (
            self.endpoint_id,
            self.endpoint_name.take(),
            self.endpoint_url.take(),
        ) else {
            return Ok(None);
        };
        let filter = crate::domain::EndpointFilter::from_columns(
            self.signal_types.as_deref().unwrap_or_default(),
            self.decisions.as_deref().unwrap_or_default(),
            self.feeds.as_deref().unwrap_or_default(),
        )
        .map_err(|e| crate::store::StoreError::Corrupt(Box::new(e)))?;
        Ok(Some(EndpointTarget {
            id,
            name,
            url,
            sealed_secret: self.endpoint_secret.take(),
            filter,
            disabled: self.endpoint_disabled.unwrap_or(false),
        }))
    }
}

/// One of the tenant's callback endpoints, as a decision reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointTarget {
    pub id: Uuid,
    pub name: String,
    pub url: String,
    /// Its own signing secret, sealed; `None` signs with the tenant's webhook secrets.
    pub sealed_secret: Option<Vec<u8>>,
    pub filter: crate::domain::EndpointFilter,
    /// Disabled (by the tenant, or after a 410): its callbacks are stored suspended.
    pub disabled: bool,
}

/// Leaves the sealed secret out.
impl std::fmt::Debug for EndpointTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointTarget")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("filter", &self.filter)
            .field("disabled", &self.disabled)
            .finish_non_exhaustive()
    }
}

/// What a decision reads, in one round trip: the playbook version in force, the subject's
/// facts as they are before this signal, and where its callbacks go now (read fresh, so a
/// disabled or changed endpoint applies to the very next signal).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecisionInputs {
    /// The tenant's newest uploaded version; `None` means the built-in default.
    pub playbook_version: Option<i64>,
    /// Whether the subject's account is locked.
    pub subject_locked: bool,
    /// The tenant's callback endpoints.
    pub endpoints: Vec<EndpointTarget>,
}

/// Playbook versions.
#[async_trait]
pub trait PlaybookStore {
    /// The tenant's newest playbook, if it uploaded one.
    async fn current_playbook(&self, tenant_id: Uuid)
    -> Result<Option<StoredPlaybook>, StoreError>;
    /// One version of the tenant's playbook.
    async fn playbook_version(
        &self,
        tenant_id: Uuid,
        version: i64,
    ) -> Result<Option<StoredPlaybook>, StoreError>;
    /// Stores a validated playbook as the next version; returns that version.
    async fn put_playbook(
        &self,
        tenant_id: Uuid,
        format: &str,
        source: &str,
        now: i64,
    ) -> Result<i64, StoreError>;
    /// Deletes up to `limit` playbook versions older than each tenant's newest `keep` that no
    /// event names; returns how many.
    async fn prune_playbooks(&self, keep: i64, limit: i64) -> Result<u64, StoreError>;
    /// The version in force, the subject's facts and the callback destination of each
    /// (tenant, subject), in one statement for all of them; unknown tenants are left out.
    async fn decision_inputs(
        &self,
        subjects: &[(Uuid, Vec<u8>)],
    ) -> Result<HashMap<(Uuid, Vec<u8>), DecisionInputs>, StoreError>;
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> PlaybookStore for B
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    usize: ColumnIndex<DB::Row>,
    for<'n> &'n str: ColumnIndex<DB::Row>,
    for<'e> Uuid: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Uuid>: Encode<'e, DB>,
    for<'e> i64: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i64>: Encode<'e, DB>,
    for<'e> i32: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<i32>: Encode<'e, DB>,
    for<'e> bool: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> String: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<String>: Encode<'e, DB>,
    for<'e> Vec<u8>: Encode<'e, DB> + Decode<'e, DB> + Type<DB>,
    for<'e> Option<Vec<u8>>: Encode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    async fn current_playbook(
        &self,
        tenant_id: uuid::Uuid,
    ) -> Result<Option<crate::store::StoredPlaybook>, crate::store::StoreError> {
        Ok(sqlx::query_as(
            "SELECT version, format, source, created_at FROM playbooks \
             WHERE tenant_id = $1 ORDER BY version DESC LIMIT 1",
        )
        .bind(tenant_id)
        .fetch_optional(self.read())
        .await?)
    }

    async fn playbook_version(
        &self,
        tenant_id: uuid::Uuid,
        version: i64,
    ) -> Result<Option<crate::store::StoredPlaybook>, crate::store::StoreError> {
        Ok(sqlx::query_as(
            "SELECT version, format, source, created_at FROM playbooks \
             WHERE tenant_id = $1 AND version = $2",
        )
        .bind(tenant_id)
        .bind(version)
        .fetch_optional(self.read())
        .await?)
    }

    async fn put_playbook(
        &self,
        tenant_id: uuid::Uuid,
        format: &str,
        source: &str,
        now: i64,
    ) -> Result<i64, crate::store::StoreError> {
        // The primary key (tenant, version) makes a concurrent upload fail rather than
        // overwrite.
        let version = sqlx::query_scalar(
            "INSERT INTO playbooks (tenant_id, version, format, source, created_at) \
             SELECT $1, COALESCE(MAX(version), 0) + 1, $2, $3, $4 FROM playbooks \
             WHERE tenant_id = $1 RETURNING version",
        )
        .bind(tenant_id)
        .bind(format)
        .bind(source)
        .bind(now)
        .fetch_one(self.write())
        .await?;
        Ok(version)
    }

    async fn prune_playbooks(
        &self,
        keep: i64,
        limit: i64,
    ) -> Result<u64, crate::store::StoreError> {
        // Versions are numbered MAX + 1 and the newest `keep` are never deleted, so they
        // are exactly the ones above MAX - keep.
        let done = sqlx::query(
            "DELETE FROM playbooks WHERE (tenant_id, version) IN ( \
             SELECT p.tenant_id, p.version FROM playbooks p \
             WHERE p.version <= (SELECT MAX(m.version) FROM playbooks m \
             WHERE m.tenant_id = p.tenant_id) - $1 \
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.tenant_id = p.tenant_id \
             AND e.playbook_version = p.version) LIMIT $2)",
        )
        .bind(keep)
        .bind(limit)
        .execute(self.write())
        .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn decision_inputs(
        &self,
        subjects: &[(uuid::Uuid, Vec<u8>)],
    ) -> Result<
        std::collections::HashMap<(uuid::Uuid, Vec<u8>), crate::store::DecisionInputs>,
        crate::store::StoreError,
    > {
        if subjects.is_empty() {
            return Ok(Default::default());
        }
        // The lock is joined, not asked with EXISTS: PostgreSQL may answer an EXISTS by
        // hashing the whole table once per statement, and a kept (generic) plan that
        // does so reads every lock for every batch.
        let mut q = sqlx::QueryBuilder::<DB>::new(
            "SELECT v.column1 AS tenant_id, v.column2 AS subject_hash, \
             (SELECT MAX(version) FROM playbooks p WHERE p.tenant_id = v.column1) \
             AS playbook_version, s.locked_by IS NOT NULL AS subject_locked, \
             ep.id AS endpoint_id, ep.name AS endpoint_name, ep.url AS endpoint_url, \
             ep.sealed_secret AS endpoint_secret, ep.signal_types, ep.decisions, ep.feeds, \
             ep.disabled AS endpoint_disabled FROM ",
        );
        DB::push_keys(&mut q, subjects);
        q.push(
            " AS v JOIN tenants t ON t.id = v.column1 \
             LEFT JOIN subjects s ON s.tenant_id = v.column1 \
             AND s.subject_hash = v.column2 \
             LEFT JOIN endpoints ep ON ep.tenant_id = v.column1",
        );
        let rows: Vec<crate::store::playbooks::DecisionInputsRow> = crate::store::answered_within(
            B::ANSWER_DEADLINE,
            q.build_query_as().fetch_all(self.decisions()),
        )
        .await?;
        let mut found: std::collections::HashMap<_, crate::store::DecisionInputs> =
            std::collections::HashMap::with_capacity(subjects.len());
        for mut row in rows {
            let endpoint = row.endpoint()?;
            let inputs = found
                .entry((row.tenant_id, std::mem::take(&mut row.subject_hash)))
                .or_insert_with(|| crate::store::DecisionInputs {
                    playbook_version: row.playbook_version,
                    subject_locked: row.subject_locked,
                    endpoints: Vec::new(),
                });
            inputs.endpoints.extend(endpoint);
        }
        // One order whatever the plan: the endpoints' rows go out in it.
        for inputs in found.values_mut() {
            inputs.endpoints.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Ok(found)
    }
}
