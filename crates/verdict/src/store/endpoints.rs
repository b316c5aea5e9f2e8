//! Callback endpoints: each belongs to one tenant under a name of its choosing; its signing
//! secret is stored only sealed. The endpoint named `default` is the tenant's callback URL:
//! its id is the tenant's and it signs with the tenant's webhook secrets.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};
use super::deliveries::{count_suspended, resume_suspended};
use crate::domain::{EndpointFilter, EndpointName, SuspendedCallbacks};

/// An endpoint as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointRecord {
    pub id: Uuid,
    pub tenant_id: Uuid,
    pub name: EndpointName,
    pub url: String,
    /// Its own signing secret, sealed under the master key; `None` for the `default`
    /// endpoint, which signs with the tenant's webhook secrets.
    pub sealed_secret: Option<Vec<u8>>,
    pub filter: EndpointFilter,
    /// Disabled by the tenant, or by a receiver's 410: its callbacks are stored suspended.
    pub disabled: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Leaves the sealed secret out, though it is sealed.
impl std::fmt::Debug for EndpointRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointRecord")
            .field("id", &self.id)
            .field("tenant_id", &self.tenant_id)
            .field("name", &self.name)
            .field("filter", &self.filter)
            .field("disabled", &self.disabled)
            .finish_non_exhaustive()
    }
}

/// What putting an endpoint did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutEndpoint {
    /// Stored: new (`created`) or replacing the one of that name, whose id it keeps; with how many of its suspended callbacks were made due (or are left
    /// suspended).
    Stored {
        record: Box<EndpointRecord>,
        created: bool,
        suspended: u64,
    },
    /// Not stored: the tenant has `max` endpoints already and this name is not one of them.
    TooMany,
    /// No such tenant.
    NoTenant,
}

/// Tenants' callback endpoints.
#[async_trait]
pub trait EndpointStore {
    /// Stores `endpoint` under its tenant and name, unless that would give the tenant more
    /// than `max`; replacing one keeps its id and creation time. Enabled, its
    /// suspended callbacks are made due or left as `suspended` says, in the same transaction.
    async fn put_endpoint(
        &self,
        endpoint: &EndpointRecord,
        max: i64,
        suspended: SuspendedCallbacks,
    ) -> Result<PutEndpoint, StoreError>;
    /// Enables or disables one of the tenant's endpoints, changing nothing else; enabled, its
    /// suspended callbacks are made due or left as `suspended` says, in the same transaction.
    /// `None` if the tenant has no endpoint of that name, else how many suspended callbacks
    /// were made due (or are left).
    async fn set_endpoint_enabled(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
        enabled: bool,
        suspended: SuspendedCallbacks,
        now: i64,
    ) -> Result<Option<u64>, StoreError>;
    /// One of the tenant's endpoints.
    async fn endpoint(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
    ) -> Result<Option<EndpointRecord>, StoreError>;
    /// The tenant's endpoints, by name.
    async fn endpoints(&self, tenant_id: Uuid) -> Result<Vec<EndpointRecord>, StoreError>;
    /// Deletes one of the tenant's endpoints; false if it had none of that name. Its pending
    /// callbacks then fail when attempted, saying there is no endpoint.
    async fn delete_endpoint(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
    ) -> Result<bool, StoreError>;
}

/// The columns of [`EndpointRow`], in its order.
pub(crate) const ENDPOINT_COLUMNS: &str = "id, tenant_id, name, url, sealed_secret, \
     signal_types, decisions, feeds, disabled, created_at, updated_at";

/// An endpoint as read, before its name and filter are decoded.
#[derive(sqlx::FromRow)]
pub(crate) struct EndpointRow {
    id: Uuid,
    tenant_id: Uuid,
    name: String,
    url: String,
    sealed_secret: Option<Vec<u8>>,
    signal_types: String,
    decisions: String,
    feeds: String,
    disabled: bool,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<EndpointRow> for EndpointRecord {
    type Error = StoreError;

    fn try_from(row: EndpointRow) -> Result<Self, StoreError> {
        let corrupt = |e: Box<dyn std::error::Error + Send + Sync>| StoreError::Corrupt(e);
        Ok(Self {
            id: row.id,
            tenant_id: row.tenant_id,
            name: row.name.parse().map_err(|e| corrupt(Box::new(e)))?,
            url: row.url,
            sealed_secret: row.sealed_secret,
            filter: EndpointFilter::from_columns(&row.signal_types, &row.decisions, &row.feeds)
                .map_err(|e| corrupt(Box::new(e)))?,
            disabled: row.disabled,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> EndpointStore for B
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
    for<'e> Option<Vec<u8>>: Encode<'e, DB> + Decode<'e, DB>,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Option<&'e str>: Encode<'e, DB>,
    for<'e> &'e [u8]: Encode<'e, DB> + Type<DB>,
{
    async fn put_endpoint(
        &self,
        e: &EndpointRecord,
        max: i64,
        suspended: SuspendedCallbacks,
    ) -> Result<PutEndpoint, StoreError> {
        // One statement decides the bound, as for connectors: the tenant's puts take turns
        // first, so two at once cannot each count the other's row out.
        let mut tx = self.begin().await?;
        if let Some(lock) = B::LOCK_TENANT {
            sqlx::query(lock)
                .bind(e.tenant_id)
                .execute(&mut *tx)
                .await?;
        }
        let tenant: Option<i32> = sqlx::query_scalar("SELECT 1 FROM tenants WHERE id = $1")
            .bind(e.tenant_id)
            .fetch_optional(&mut *tx)
            .await?;
        if tenant.is_none() {
            return Ok(PutEndpoint::NoTenant);
        }
        let existing: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM endpoints WHERE tenant_id = $1 AND name = $2")
                .bind(e.tenant_id)
                .bind(e.name.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let [signal_types, decisions, feeds] = e.filter.columns();
        let sql = format!(
            "INSERT INTO endpoints ({ENDPOINT_COLUMNS}) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11 \
             WHERE (SELECT COUNT(*) FROM endpoints WHERE tenant_id = $2) < $12 \
                OR EXISTS (SELECT 1 FROM endpoints WHERE tenant_id = $2 AND name = $3) \
             ON CONFLICT (tenant_id, name) DO UPDATE SET url = excluded.url, \
                sealed_secret = excluded.sealed_secret, signal_types = excluded.signal_types, decisions = excluded.decisions, \
                feeds = excluded.feeds, disabled = excluded.disabled, \
                updated_at = excluded.updated_at \
             RETURNING {ENDPOINT_COLUMNS}"
        );
        let stored: Option<EndpointRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(e.id)
            .bind(e.tenant_id)
            .bind(e.name.as_str())
            .bind(e.url.as_str())
            .bind(e.sealed_secret.clone())
            .bind(signal_types)
            .bind(decisions)
            .bind(feeds)
            .bind(e.disabled)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(max)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(stored) = stored else {
            return Ok(PutEndpoint::TooMany);
        };
        let record = EndpointRecord::try_from(stored)?;
        let suspended = match suspended {
            SuspendedCallbacks::Resume if !record.disabled => {
                resume_suspended(&mut *tx, e.tenant_id, record.id, e.updated_at).await?
            }
            _ => count_suspended(&mut *tx, e.tenant_id, record.id).await?,
        };
        tx.commit().await?;
        Ok(PutEndpoint::Stored {
            created: existing.is_none(),
            record: Box::new(record),
            suspended,
        })
    }

    async fn set_endpoint_enabled(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
        enabled: bool,
        suspended: SuspendedCallbacks,
        now: i64,
    ) -> Result<Option<u64>, StoreError> {
        let mut tx = self.begin().await?;
        let id: Option<Uuid> = sqlx::query_scalar(
            "UPDATE endpoints SET disabled = $3, updated_at = $4 \
             WHERE tenant_id = $1 AND name = $2 RETURNING id",
        )
        .bind(tenant_id)
        .bind(name.as_str())
        .bind(!enabled)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(id) = id else {
            return Ok(None);
        };
        let n = match suspended {
            SuspendedCallbacks::Resume if enabled => {
                resume_suspended(&mut *tx, tenant_id, id, now).await?
            }
            _ => count_suspended(&mut *tx, tenant_id, id).await?,
        };
        tx.commit().await?;
        Ok(Some(n))
    }

    async fn endpoint(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        let sql =
            format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE tenant_id = $1 AND name = $2");
        let row: Option<EndpointRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .bind(name.as_str())
            .fetch_optional(self.read())
            .await?;
        row.map(EndpointRecord::try_from).transpose()
    }

    async fn endpoints(&self, tenant_id: Uuid) -> Result<Vec<EndpointRecord>, StoreError> {
        let sql =
            format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE tenant_id = $1 ORDER BY name");
        let rows: Vec<EndpointRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant_id)
            .fetch_all(self.read())
            .await?;
        rows.into_iter().map(EndpointRecord::try_from).collect()
    }

    async fn delete_endpoint(
        &self,
        tenant_id: Uuid,
        name: &EndpointName,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM endpoints WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name.as_str())
            .execute(self.write())
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }
}
