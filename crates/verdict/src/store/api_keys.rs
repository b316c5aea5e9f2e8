//! API keys: each belongs to one tenant, carries one scope, and is stored only as its SHA-256.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::backend::{Backend, SqlDb};
use super::{StoreError, TenantRecord};
use crate::domain::Feed;

/// What a key may do.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `POST /v1/signals` only.
    Ingest,
    /// The read endpoints only.
    Read,
    /// Everything, including the playbook, redeliveries and keys.
    Admin,
}

impl Scope {
    /// The stored and shown name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ingest => "ingest",
            Self::Read => "read",
            Self::Admin => "admin",
        }
    }

    /// Whether a key of this scope may do what `needed` names.
    pub fn allows(self, needed: Scope) -> bool {
        self == Self::Admin || self == needed
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A scope name that is not one of `ingest`, `read`, `admin`.
#[derive(Debug, thiserror::Error)]
#[error("the scope must be one of ingest, read, admin")]
pub struct UnknownScope;

impl FromStr for Scope {
    type Err = UnknownScope;

    fn from_str(s: &str) -> Result<Self, UnknownScope> {
        match s {
            "ingest" => Ok(Self::Ingest),
            "read" => Ok(Self::Read),
            "admin" => Ok(Self::Admin),
            _ => Err(UnknownScope),
        }
    }
}

/// A key to insert.
#[derive(Clone, Debug)]
pub struct NewApiKey {
    pub id: Uuid,
    pub tenant_id: Uuid,
    /// SHA-256 of the key (as the secrets module hashes it); the key itself is never stored.
    pub key_hash: [u8; 32],
    pub scope: Scope,
    /// The one feed an `ingest` key is made for, if any.
    pub feed: Option<Feed>,
    pub created_at: i64,
}

/// A key as listed: everything but its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKeyRecord {
    pub id: Uuid,
    pub scope: Scope,
    /// The one feed the key is made for, if any.
    pub feed: Option<Feed>,
    pub created_at: i64,
    /// Updated at most once a minute per key and instance, so it is that precise.
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

/// What a live key grants: its tenant, its scope, and which key it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyGrant {
    pub key_id: Uuid,
    pub scope: Scope,
    /// The one feed the key may post to, if it is made for one: then it may do nothing else.
    pub feed: Option<Feed>,
    pub tenant: TenantRecord,
}

/// API keys.
#[async_trait]
pub trait ApiKeyStore {
    /// Adds a key to its tenant, unless the tenant has `max_live` unrevoked keys already;
    /// returns whether it did. One statement decides it, the tenant's issues taking turns.
    async fn insert_api_key(&self, key: &NewApiKey, max_live: i64) -> Result<bool, StoreError>;
    /// The tenant and scope of the unrevoked key whose hash is `key_hash`.
    async fn grant_by_key_hash(&self, key_hash: &[u8]) -> Result<Option<KeyGrant>, StoreError>;
    /// A page of a tenant's keys, oldest first, revoked ones included: up to `limit` after
    /// the key `after` (none if that is not one of the tenant's keys).
    async fn api_keys(
        &self,
        tenant_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Revokes one of the tenant's keys at `now` (a revoked key keeps its first revocation
    /// time); false if the tenant has no such key.
    async fn revoke_api_key(
        &self,
        tenant_id: Uuid,
        key_id: Uuid,
        now: i64,
    ) -> Result<bool, StoreError>;
    /// Records that a key was used at `at` (never moving the time backwards).
    async fn touch_api_key(&self, key_id: Uuid, at: i64) -> Result<(), StoreError>;
}

/// Decodes a stored feed restriction.
pub(crate) fn stored_feed(name: Option<String>) -> Result<Option<Feed>, StoreError> {
    name.map(|name| name.parse().map_err(|e| StoreError::Corrupt(Box::new(e))))
        .transpose()
}

/// Decodes a stored scope.
pub(crate) fn stored_scope(name: &str) -> Result<Scope, StoreError> {
    name.parse()
        .map_err(|_| StoreError::Corrupt(format!("unknown API key scope {name:?}").into()))
}

/// A [`KeyGrant`] as read: the tenant's columns beside the key's.
#[derive(sqlx::FromRow)]
pub(crate) struct GrantRow {
    #[sqlx(flatten)]
    pub tenant: TenantRecord,
    pub key_id: Uuid,
    pub key_scope: String,
    pub key_feed: Option<String>,
}

/// Inserts a key row if its tenant has fewer than `max_live` unrevoked keys; whether it did
/// (also used by tenant creation, in its transaction).
pub(crate) async fn insert_api_key_row<DB, C>(
    conn: &mut C,
    key: &crate::store::NewApiKey,
    max_live: i64,
) -> Result<bool, sqlx::Error>
where
    DB: SqlDb + Database<Connection = C>,
    C: sqlx::Connection<Database = DB>,
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
    let done = sqlx::query(
        "INSERT INTO api_keys (id, tenant_id, key_hash, scope, feed, created_at) \
         SELECT $1, $2, $3, $4, $5, $6 WHERE (SELECT COUNT(*) FROM api_keys \
            WHERE tenant_id = $2 AND revoked_at IS NULL) < $7",
    )
    .bind(key.id)
    .bind(key.tenant_id)
    .bind(&key.key_hash[..])
    .bind(key.scope.as_str())
    .bind(key.feed.map(Feed::as_str))
    .bind(key.created_at)
    .bind(max_live)
    .execute(conn)
    .await?;
    Ok(DB::rows_affected(&done) == 1)
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> ApiKeyStore for B
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
    async fn insert_api_key(
        &self,
        key: &crate::store::NewApiKey,
        max_live: i64,
    ) -> Result<bool, crate::store::StoreError> {
        // As with connectors: two statements at once could each count the other's key out
        // (PostgreSQL's statements see what was committed when they began), so the tenant's
        // issues take turns on its row first.
        let mut tx = self.begin().await?;
        if let Some(lock) = B::LOCK_TENANT {
            sqlx::query(lock)
                .bind(key.tenant_id)
                .execute(&mut *tx)
                .await?;
        }
        let inserted = insert_api_key_row(&mut *tx, key, max_live).await?;
        tx.commit().await?;
        Ok(inserted)
    }

    async fn grant_by_key_hash(
        &self,
        key_hash: &[u8],
    ) -> Result<Option<crate::store::KeyGrant>, crate::store::StoreError> {
        // The key's columns are renamed in a subquery so the tenant's stay unqualified.
        let sql = format!(
            "SELECT {}, key_id, key_scope, key_feed FROM tenants JOIN ( \
             SELECT id AS key_id, tenant_id AS key_tenant, scope AS key_scope, feed AS key_feed \
             FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL \
             ) k ON k.key_tenant = tenants.id",
            crate::store::tenants::TENANT_COLUMNS
        );
        // Every request whose credentials are not cached asks this first: a silent database
        // must not hold it.
        let row: Option<crate::store::api_keys::GrantRow> = crate::store::answered_within(
            B::ANSWER_DEADLINE,
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(key_hash)
                .fetch_optional(self.read()),
        )
        .await?;
        row.map(|row| {
            Ok(crate::store::KeyGrant {
                key_id: row.key_id,
                scope: crate::store::api_keys::stored_scope(&row.key_scope)?,
                feed: crate::store::api_keys::stored_feed(row.key_feed)?,
                tenant: row.tenant,
            })
        })
        .transpose()
    }

    async fn api_keys(
        &self,
        tenant_id: uuid::Uuid,
        after: Option<uuid::Uuid>,
        limit: i64,
    ) -> Result<Vec<crate::store::ApiKeyRecord>, crate::store::StoreError> {
        // Keyset pagination on the listing's order; the cursor's own row gives its place (a
        // first key moved over by migration 0005 has a random id, so the id alone would not).
        type KeyRow = (
            uuid::Uuid,
            String,
            Option<String>,
            i64,
            Option<i64>,
            Option<i64>,
        );
        let rows: Vec<KeyRow> = sqlx::query_as(
            "SELECT id, scope, feed, created_at, last_used_at, revoked_at FROM api_keys \
             WHERE tenant_id = $1 AND ($2 IS NULL OR (created_at, id) > \
                (SELECT c.created_at, c.id FROM api_keys c WHERE c.tenant_id = $1 AND c.id = $2)) \
             ORDER BY created_at, id LIMIT $3",
        )
        .bind(tenant_id)
        .bind(after)
        .bind(limit)
        .fetch_all(self.read())
        .await?;
        rows.into_iter()
            .map(|(id, scope, feed, created_at, last_used_at, revoked_at)| {
                Ok(crate::store::ApiKeyRecord {
                    id,
                    scope: crate::store::api_keys::stored_scope(&scope)?,
                    feed: crate::store::api_keys::stored_feed(feed)?,
                    created_at,
                    last_used_at,
                    revoked_at,
                })
            })
            .collect()
    }

    async fn revoke_api_key(
        &self,
        tenant_id: uuid::Uuid,
        key_id: uuid::Uuid,
        now: i64,
    ) -> Result<bool, crate::store::StoreError> {
        let done = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $3) \
             WHERE id = $2 AND tenant_id = $1",
        )
        .bind(tenant_id)
        .bind(key_id)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn touch_api_key(
        &self,
        key_id: uuid::Uuid,
        at: i64,
    ) -> Result<(), crate::store::StoreError> {
        sqlx::query(
            "UPDATE api_keys SET last_used_at = $2 \
             WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < $2)",
        )
        .bind(key_id)
        .bind(at)
        .execute(self.write())
        .await?;
        Ok(())
    }
}
