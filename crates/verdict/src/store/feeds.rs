//! What the standard feeds need registered per tenant: its Security Event Token transmitter
//! and its CAMARA subscriptions (the latter only as keyed digests).

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::StoreError;
use super::backend::{Backend, SqlDb};

/// A tenant's SET transmitter, as stored.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct TransmitterRecord {
    pub tenant_id: Uuid,
    /// The `iss` its SETs carry.
    pub issuer: String,
    /// The `aud` its SETs must name.
    pub audience: String,
    /// Its JWKS, given once as a document (`--jwks-file`).
    pub jwks: Option<String>,
    /// Or where its JWKS is fetched from (`--jwks-url`).
    pub jwks_url: Option<String>,
    pub updated_at: i64,
}

/// Transmitters and subscriptions.
#[async_trait]
pub trait FeedStore {
    /// Sets (or replaces) the tenant's transmitter.
    async fn put_transmitter(&self, transmitter: &TransmitterRecord) -> Result<(), StoreError>;
    /// The tenant's transmitter, if it has one.
    async fn transmitter(&self, tenant_id: Uuid) -> Result<Option<TransmitterRecord>, StoreError>;
    /// Registers (or re-points) a CAMARA subscription: its digest and the subject digest of its
    /// phone number.
    async fn put_camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
        subject_hash: &[u8],
        now: i64,
    ) -> Result<(), StoreError>;
    /// Forgets a CAMARA subscription; false if it was not registered.
    async fn remove_camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
    ) -> Result<bool, StoreError>;
    /// The subject digest a registered CAMARA subscription stands for.
    async fn camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError>;
}

/// The SQL of [`FeedStore`], for every backend.
#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> FeedStore for B
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
    async fn put_transmitter(&self, t: &TransmitterRecord) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO set_transmitters (tenant_id, issuer, audience, jwks, jwks_url, \
             updated_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (tenant_id) DO UPDATE SET issuer = excluded.issuer, \
             audience = excluded.audience, jwks = excluded.jwks, \
             jwks_url = excluded.jwks_url, updated_at = excluded.updated_at",
        )
        .bind(t.tenant_id)
        .bind(&t.issuer)
        .bind(&t.audience)
        .bind(&t.jwks)
        .bind(&t.jwks_url)
        .bind(t.updated_at)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn transmitter(&self, tenant_id: Uuid) -> Result<Option<TransmitterRecord>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT tenant_id, issuer, audience, jwks, jwks_url, updated_at \
             FROM set_transmitters WHERE tenant_id = $1",
        )
        .bind(tenant_id)
        .fetch_optional(self.read())
        .await?)
    }

    async fn put_camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
        subject_hash: &[u8],
        now: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO camara_subscriptions (tenant_id, subscription_digest, \
             subject_hash, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, subscription_digest) DO UPDATE \
             SET subject_hash = excluded.subject_hash",
        )
        .bind(tenant_id)
        .bind(subscription_digest)
        .bind(subject_hash)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn remove_camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "DELETE FROM camara_subscriptions \
             WHERE tenant_id = $1 AND subscription_digest = $2",
        )
        .bind(tenant_id)
        .bind(subscription_digest)
        .execute(self.write())
        .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn camara_subscription(
        &self,
        tenant_id: Uuid,
        subscription_digest: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT subject_hash FROM camara_subscriptions \
             WHERE tenant_id = $1 AND subscription_digest = $2",
        )
        .bind(tenant_id)
        .bind(subscription_digest)
        .fetch_optional(self.read())
        .await?)
    }
}
