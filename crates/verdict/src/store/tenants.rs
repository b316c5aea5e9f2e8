//! Tenants, their rate limits, and their signing secrets sealed under the master key (their API
//! keys are in [`super::api_keys`]).

use async_trait::async_trait;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::api_keys::insert_api_key_row;
use super::backend::{Backend, SqlDb};

/// Which secret of a tenant's a row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

/// A stored secret purpose this version does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown secret purpose {0:?}")]
pub struct UnknownPurpose(String);

impl std::str::FromStr for SecretPurpose {
    type Err = UnknownPurpose;

    fn from_str(s: &str) -> Result<Self, UnknownPurpose> {
        match s {
            "inbound" => Ok(Self::Inbound),
            "webhook" => Ok(Self::Webhook),
            other => Err(UnknownPurpose(other.to_owned())),
        }
    }
}

/// A tenant to insert.
#[derive(Clone, Debug)]
pub struct NewTenant {
    pub id: Uuid,
    pub name: String,
    /// The tenant's first key, an admin one, inserted with it.
    pub admin_key: super::NewApiKey,
    pub inbound_signature_required: bool,
    /// Whether inbound signatures must cover the idempotency key (`v1` is not taken).
    pub inbound_signature_covers_key: bool,
    pub callback_url: Option<String>,
    pub created_at: i64,
}

/// A tenant as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TenantRecord {
    pub id: Uuid,
    pub name: String,
    pub inbound_signature_required: bool,
    /// Whether inbound signatures must cover the idempotency key (`v1` is not taken).
    pub inbound_signature_covers_key: bool,
    pub callback_url: Option<String>,
    pub callback_disabled: bool,
    /// Requests per second (and burst) for this tenant, over the server's setting.
    pub rate_limit_per_second: Option<i64>,
    /// Unix ms.
    pub created_at: i64,
}

/// A signing secret sealed under the master key.
#[derive(Clone, Debug)]
pub struct SealedSecret {
    pub id: Uuid,
    pub purpose: SecretPurpose,
    pub sealed: Vec<u8>,
    pub created_at: i64,
    /// When it stops being valid (after a rotation's grace period).
    pub retired_at: Option<i64>,
}

/// Tenants and their credentials.
#[async_trait]
pub trait TenantStore {
    /// Inserts a tenant, its admin key and its first secrets in one transaction.
    async fn create_tenant(
        &self,
        tenant: &NewTenant,
        secrets: &[SealedSecret],
    ) -> Result<(), StoreError>;
    /// A tenant by id.
    async fn tenant(&self, id: Uuid) -> Result<Option<TenantRecord>, StoreError>;
    /// Up to `limit` tenants in id order, after `after` if given: a page of all of them.
    async fn tenants(
        &self,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<TenantRecord>, StoreError>;
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
    /// Sets (or, with `None`, removes) the tenant's own rate limit; false if no such tenant.
    async fn set_rate_limit(
        &self,
        tenant_id: Uuid,
        per_second: Option<i64>,
    ) -> Result<bool, StoreError>;
    /// Sets whether the tenant's inbound signatures must cover the idempotency key; false if
    /// no such tenant.
    async fn set_signature_covers_key(&self, tenant_id: Uuid, on: bool)
    -> Result<bool, StoreError>;
}

/// The columns of [`TenantRecord`].
pub(crate) const TENANT_COLUMNS: &str = "id, name, inbound_signature_required, \
     inbound_signature_covers_key, \
     (SELECT e.url FROM endpoints e WHERE e.id = tenants.id) AS callback_url, \
     COALESCE((SELECT e.disabled FROM endpoints e WHERE e.id = tenants.id), FALSE) \
     AS callback_disabled, rate_limit_per_second, created_at";

async fn insert_secret<DB, C>(
    conn: &mut C,
    tenant_id: uuid::Uuid,
    secret: &crate::store::SealedSecret,
) -> Result<(), sqlx::Error>
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
    sqlx::query(
        "INSERT INTO tenant_secrets (id, tenant_id, purpose, sealed, created_at) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(secret.id)
    .bind(tenant_id)
    .bind(secret.purpose.as_str())
    .bind(&secret.sealed)
    .bind(secret.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> TenantStore for B
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
    async fn create_tenant(
        &self,
        tenant: &crate::store::NewTenant,
        secrets: &[crate::store::SealedSecret],
    ) -> Result<(), crate::store::StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO tenants (id, name, inbound_signature_required, \
             inbound_signature_covers_key, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(tenant.id)
        .bind(&tenant.name)
        .bind(tenant.inbound_signature_required)
        .bind(tenant.inbound_signature_covers_key)
        .bind(tenant.created_at)
        .execute(&mut *tx)
        .await?;
        // Its callback URL is its `default` endpoint: the tenant's id, its webhook secrets.
        if let Some(url) = &tenant.callback_url {
            sqlx::query(
                "INSERT INTO endpoints (id, tenant_id, name, url, created_at, updated_at) \
                 VALUES ($1, $1, $2, $3, $4, $4)",
            )
            .bind(tenant.id)
            .bind(crate::domain::DEFAULT_ENDPOINT)
            .bind(url)
            .bind(tenant.created_at)
            .execute(&mut *tx)
            .await?;
        }
        // A new tenant's first key: no other key of its can count against it.
        insert_api_key_row(&mut *tx, &tenant.admin_key, 1).await?;
        for secret in secrets {
            insert_secret(&mut *tx, tenant.id, secret).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn tenant(
        &self,
        id: uuid::Uuid,
    ) -> Result<Option<crate::store::TenantRecord>, crate::store::StoreError> {
        let sql = format!(
            "SELECT {} FROM tenants WHERE id = $1",
            crate::store::tenants::TENANT_COLUMNS
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.read())
            .await?)
    }

    async fn tenants(
        &self,
        after: Option<uuid::Uuid>,
        limit: i64,
    ) -> Result<Vec<crate::store::TenantRecord>, crate::store::StoreError> {
        let sql = format!(
            "SELECT {} FROM tenants WHERE $1 IS NULL OR id > $1 ORDER BY id LIMIT $2",
            crate::store::tenants::TENANT_COLUMNS
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(limit)
            .fetch_all(self.read())
            .await?)
    }

    async fn live_secrets(
        &self,
        tenant_id: uuid::Uuid,
        purpose: crate::store::SecretPurpose,
        now: i64,
    ) -> Result<Vec<crate::store::SealedSecret>, crate::store::StoreError> {
        // A signed request whose tenant's secrets are not cached asks this: a silent database
        // must not hold it.
        let rows: Vec<(uuid::Uuid, Vec<u8>, i64, Option<i64>)> = crate::store::answered_within(
            B::ANSWER_DEADLINE,
            sqlx::query_as(
                "SELECT id, sealed, created_at, retired_at FROM tenant_secrets \
                 WHERE tenant_id = $1 AND purpose = $2 \
                 AND (retired_at IS NULL OR retired_at > $3) ORDER BY created_at DESC",
            )
            .bind(tenant_id)
            .bind(purpose.as_str())
            .bind(now)
            .fetch_all(self.read()),
        )
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, sealed, created_at, retired_at)| crate::store::SealedSecret {
                    id,
                    purpose,
                    sealed,
                    created_at,
                    retired_at,
                },
            )
            .collect())
    }

    async fn rotate_secret(
        &self,
        tenant_id: uuid::Uuid,
        secret: &crate::store::SealedSecret,
        retire_at: i64,
    ) -> Result<(), crate::store::StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE tenant_secrets SET retired_at = $3 WHERE tenant_id = $1 \
             AND purpose = $2 AND (retired_at IS NULL OR retired_at > $3)",
        )
        .bind(tenant_id)
        .bind(secret.purpose.as_str())
        .bind(retire_at)
        .execute(&mut *tx)
        .await?;
        insert_secret(&mut *tx, tenant_id, secret).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn set_rate_limit(
        &self,
        tenant_id: uuid::Uuid,
        per_second: Option<i64>,
    ) -> Result<bool, crate::store::StoreError> {
        let done = sqlx::query("UPDATE tenants SET rate_limit_per_second = $2 WHERE id = $1")
            .bind(tenant_id)
            .bind(per_second)
            .execute(self.write())
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn set_signature_covers_key(
        &self,
        tenant_id: uuid::Uuid,
        on: bool,
    ) -> Result<bool, crate::store::StoreError> {
        let done =
            sqlx::query("UPDATE tenants SET inbound_signature_covers_key = $2 WHERE id = $1")
                .bind(tenant_id)
                .bind(on)
                .execute(self.write())
                .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
