//! Connectors: each belongs to one tenant under a name of its choosing; the credential is
//! stored only sealed.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};
use crate::domain::{ConnectorKind, ConnectorName, Guarantee, MatchAttribute};

/// A connector as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectorRecord {
    pub tenant_id: Uuid,
    pub name: ConnectorName,
    pub kind: ConnectorKind,
    /// An HTTP connector's endpoint, or a SCIM service provider's base URL.
    pub url: String,
    /// The SCIM attribute matched against the subject's account (`userName` for HTTP ones).
    pub match_attribute: MatchAttribute,
    pub guarantee: Guarantee,
    /// The signing secret (HTTP) or bearer token (SCIM), sealed under the master key.
    pub sealed_credential: Vec<u8>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Leaves the sealed credential out, though it is sealed.
impl std::fmt::Debug for ConnectorRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorRecord")
            .field("tenant_id", &self.tenant_id)
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("guarantee", &self.guarantee)
            .finish_non_exhaustive()
    }
}

/// What putting a connector did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutConnector {
    /// Stored (new, or replacing the one of that name).
    Stored,
    /// Not stored: the tenant has `max` connectors already and this name is not one of them.
    TooMany,
}

/// Tenants' connectors.
#[async_trait]
pub trait ConnectorStore {
    /// Stores `connector`, replacing the tenant's connector of that name (keeping its
    /// creation time), unless that would give the tenant more than `max` connectors.
    async fn put_connector(
        &self,
        connector: &ConnectorRecord,
        max: i64,
    ) -> Result<PutConnector, StoreError>;
    /// One of the tenant's connectors.
    async fn connector(
        &self,
        tenant_id: Uuid,
        name: &ConnectorName,
    ) -> Result<Option<ConnectorRecord>, StoreError>;
    /// The tenant's connectors, by name.
    async fn connectors(&self, tenant_id: Uuid) -> Result<Vec<ConnectorRecord>, StoreError>;
    /// Deletes one of the tenant's connectors; false if it had none of that name.
    async fn delete_connector(
        &self,
        tenant_id: Uuid,
        name: &ConnectorName,
    ) -> Result<bool, StoreError>;
}

/// The columns of [`ConnectorRow`], in its order.
const CONNECTOR_COLUMNS: &str = "tenant_id, name, kind, url, match_attribute, guarantee, \
     sealed_credential, created_at, updated_at";

/// A connector as read, before its names are decoded.
#[derive(sqlx::FromRow)]
struct ConnectorRow {
    tenant_id: Uuid,
    name: String,
    kind: String,
    url: String,
    match_attribute: String,
    guarantee: String,
    sealed_credential: Vec<u8>,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<ConnectorRow> for ConnectorRecord {
    type Error = StoreError;

    fn try_from(row: ConnectorRow) -> Result<Self, StoreError> {
        let corrupt = |e: Box<dyn std::error::Error + Send + Sync>| StoreError::Corrupt(e);
        Ok(Self {
            tenant_id: row.tenant_id,
            name: row.name.parse().map_err(|e| corrupt(Box::new(e)))?,
            kind: row.kind.parse().map_err(|e| corrupt(Box::new(e)))?,
            url: row.url,
            match_attribute: row
                .match_attribute
                .parse()
                .map_err(|e| corrupt(Box::new(e)))?,
            guarantee: row.guarantee.parse().map_err(|e| corrupt(Box::new(e)))?,
            sealed_credential: row.sealed_credential,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> ConnectorStore for B
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
    async fn put_connector(
        &self,
        c: &ConnectorRecord,
        max: i64,
    ) -> Result<PutConnector, StoreError> {
        // One statement decides the bound: the row goes in only while the tenant is under it
        // or already has a connector of this name (replaced in place). Two such statements
        // at once could each count the other's row out (PostgreSQL's statements see what was
        // committed when they began), so the tenant's puts take turns first.
        let mut tx = self.begin().await?;
        if let Some(lock) = B::LOCK_TENANT {
            sqlx::query(lock)
                .bind(c.tenant_id)
                .execute(&mut *tx)
                .await?;
        }
        let sql = format!(
            "INSERT INTO connectors ({CONNECTOR_COLUMNS}) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
             WHERE (SELECT COUNT(*) FROM connectors WHERE tenant_id = $1) < $10 \
                OR EXISTS (SELECT 1 FROM connectors WHERE tenant_id = $1 AND name = $2) \
             ON CONFLICT (tenant_id, name) DO UPDATE SET kind = excluded.kind, \
                url = excluded.url, match_attribute = excluded.match_attribute, \
                guarantee = excluded.guarantee, sealed_credential = excluded.sealed_credential, \
                updated_at = excluded.updated_at"
        );
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(c.tenant_id)
            .bind(c.name.as_str())
            .bind(c.kind.as_str())
            .bind(c.url.as_str())
            .bind(c.match_attribute.as_str())
            .bind(c.guarantee.as_str())
            .bind(&c.sealed_credential[..])
            .bind(c.created_at)
            .bind(c.updated_at)
            .bind(max)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(if DB::rows_affected(&done) == 0 {
            PutConnector::TooMany
        } else {
            PutConnector::Stored
        })
    }

    async fn connector(
        &self,
        tenant_id: Uuid,
        name: &ConnectorName,
    ) -> Result<Option<ConnectorRecord>, StoreError> {
        let sql = format!(
            "SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE tenant_id = $1 AND name = $2"
        );
        let row: Option<ConnectorRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(name.as_str())
            .fetch_optional(self.read())
            .await?;
        row.map(ConnectorRecord::try_from).transpose()
    }

    async fn connectors(&self, tenant_id: Uuid) -> Result<Vec<ConnectorRecord>, StoreError> {
        let sql = format!(
            "SELECT {CONNECTOR_COLUMNS} FROM connectors WHERE tenant_id = $1 ORDER BY name"
        );
        let rows: Vec<ConnectorRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .fetch_all(self.read())
            .await?;
        rows.into_iter().map(ConnectorRecord::try_from).collect()
    }

    async fn delete_connector(
        &self,
        tenant_id: Uuid,
        name: &ConnectorName,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM connectors WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name.as_str())
            .execute(self.write())
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
