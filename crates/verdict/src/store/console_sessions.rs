//! Console sessions: a signed-in operator's session, stored only as the SHA-256 of the random
//! token its cookie holds, tied to the API key it was opened with.

use async_trait::async_trait;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};
use uuid::Uuid;

use super::backend::{Backend, SqlDb};
use super::{KeyGrant, Scope, StoreError, TenantRecord};

/// Sessions one API key keeps at once; opening another ends its oldest, so a key holder
/// signing in over and over cannot grow the table.
pub const MAX_SESSIONS_PER_KEY: i64 = 20;

/// A session to insert.
#[derive(Clone, Debug)]
pub struct NewConsoleSession {
    /// SHA-256 of the cookie's token; the token itself is never stored.
    pub id_hash: [u8; 32],
    pub tenant_id: Uuid,
    pub api_key_id: Uuid,
    pub scope: Scope,
    pub created_at: i64,
    /// The absolute end (unix ms).
    pub expires_at: i64,
    /// The end unless used again first; at most `expires_at`.
    pub idle_until: i64,
}

/// A live session: what its key grants, and when it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSession {
    pub grant: KeyGrant,
    pub expires_at: i64,
    pub idle_until: i64,
}

/// Console sessions.
#[async_trait]
pub trait ConsoleSessionStore {
    /// Stores a new session, ending the key's oldest beyond [`MAX_SESSIONS_PER_KEY`].
    async fn insert_console_session(&self, session: &NewConsoleSession) -> Result<(), StoreError>;
    /// The session whose token hashes to `id_hash`, if it has not ended by `now` and its key
    /// is unrevoked.
    async fn console_session(
        &self,
        id_hash: &[u8],
        now: i64,
    ) -> Result<Option<ConsoleSession>, StoreError>;
    /// Moves a session's idle end on to `idle_until` (never back).
    async fn extend_console_session(
        &self,
        id_hash: &[u8],
        idle_until: i64,
    ) -> Result<(), StoreError>;
    /// Ends a session (sign-out); ending one already gone is no error.
    async fn delete_console_session(&self, id_hash: &[u8]) -> Result<(), StoreError>;
    /// Deletes up to `limit` sessions ended by `now` or whose key is revoked; returns how many.
    async fn prune_console_sessions(&self, now: i64, limit: i64) -> Result<u64, StoreError>;
}

/// A [`ConsoleSession`] as read: the tenant's columns beside the session's.
#[derive(sqlx::FromRow)]
struct SessionRow {
    #[sqlx(flatten)]
    tenant: TenantRecord,
    key_id: Uuid,
    key_scope: String,
    expires_at: i64,
    idle_until: i64,
}

#[async_trait]
impl<B: Backend<Db = DB>, DB: SqlDb> ConsoleSessionStore for B
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
    async fn insert_console_session(&self, s: &NewConsoleSession) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO console_sessions \
             (id_hash, tenant_id, api_key_id, scope, created_at, expires_at, idle_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&s.id_hash[..])
        .bind(s.tenant_id)
        .bind(s.api_key_id)
        .bind(s.scope.as_str())
        .bind(s.created_at)
        .bind(s.expires_at)
        .bind(s.idle_until)
        .execute(&mut *tx)
        .await?;
        // In the inserting transaction, so concurrent sign-ins of one key cannot both keep
        // more than the bound.
        sqlx::query(
            "DELETE FROM console_sessions WHERE api_key_id = $1 AND id_hash NOT IN ( \
             SELECT k.id_hash FROM console_sessions k WHERE k.api_key_id = $1 \
             ORDER BY k.created_at DESC, k.id_hash LIMIT $2)",
        )
        .bind(s.api_key_id)
        .bind(MAX_SESSIONS_PER_KEY)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn console_session(
        &self,
        id_hash: &[u8],
        now: i64,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        // The key is joined on every request, so revoking it ends its sessions at once. The
        // session's columns are renamed in a subquery so the tenant's stay unqualified.
        let sql = format!(
            "SELECT {}, key_id, key_scope, expires_at, idle_until FROM tenants JOIN ( \
             SELECT s.api_key_id AS key_id, s.tenant_id AS key_tenant, s.scope AS key_scope, \
             s.expires_at, s.idle_until FROM console_sessions s \
             JOIN api_keys k ON k.id = s.api_key_id AND k.tenant_id = s.tenant_id \
             WHERE s.id_hash = $1 AND k.revoked_at IS NULL \
             AND s.expires_at > $2 AND s.idle_until > $2 \
             ) x ON x.key_tenant = tenants.id",
            super::tenants::TENANT_COLUMNS
        );
        let row: Option<SessionRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id_hash)
            .bind(now)
            .fetch_optional(self.read())
            .await?;
        row.map(|row| {
            Ok(ConsoleSession {
                grant: KeyGrant {
                    key_id: row.key_id,
                    scope: super::api_keys::stored_scope(&row.key_scope)?,
                    // Only `read` and `admin` keys sign in; a feed's key is `ingest`.
                    feed: None,
                    tenant: row.tenant,
                },
                expires_at: row.expires_at,
                idle_until: row.idle_until,
            })
        })
        .transpose()
    }

    async fn extend_console_session(
        &self,
        id_hash: &[u8],
        idle_until: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE console_sessions SET idle_until = $2 \
             WHERE id_hash = $1 AND idle_until < $2 AND expires_at >= $2",
        )
        .bind(id_hash)
        .bind(idle_until)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn delete_console_session(&self, id_hash: &[u8]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .execute(self.write())
            .await?;
        Ok(())
    }

    async fn prune_console_sessions(&self, now: i64, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM console_sessions WHERE id_hash IN ( \
             SELECT s.id_hash FROM console_sessions s \
             WHERE s.idle_until <= $1 OR s.expires_at <= $1 OR EXISTS ( \
             SELECT 1 FROM api_keys k WHERE k.id = s.api_key_id AND k.revoked_at IS NOT NULL) \
             LIMIT $2)",
        )
        .bind(now)
        .bind(limit)
        .execute(self.write())
        .await?;
        Ok(DB::rows_affected(&done))
    }
}
