//! The shared backend: PostgreSQL, for several stateless `verdict` instances and workers.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{
    CLAIM_ATTEMPTS, Claim, ClaimOutcome, Completion, ExistingKey, Judgement, KeyRef, NewTenant,
    SealedSecret, SecretPurpose, Store, StoreError, TenantRecord, judge,
};

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// PostgreSQL-backed storage.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// Connects to the database a `postgres://` URL names.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }

    /// The pool, for tests and benchmarks that measure the raw statements.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn tenant_from_row(row: &sqlx::postgres::PgRow) -> Result<TenantRecord, sqlx::Error> {
    Ok(TenantRecord {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        inbound_signature_required: row.try_get("inbound_signature_required")?,
        callback_url: row.try_get("callback_url")?,
        callback_disabled: row.try_get("callback_disabled")?,
    })
}

async fn insert_secret(
    conn: &mut PgConnection,
    tenant_id: Uuid,
    secret: &SealedSecret,
) -> Result<(), sqlx::Error> {
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
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_tenant(
        &self,
        tenant: &NewTenant,
        secrets: &[SealedSecret],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO tenants (id, name, api_key_hash, inbound_signature_required, \
             callback_url, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(tenant.id)
        .bind(&tenant.name)
        .bind(&tenant.api_key_hash)
        .bind(tenant.inbound_signature_required)
        .bind(&tenant.callback_url)
        .bind(tenant.created_at)
        .execute(&mut *tx)
        .await?;
        for secret in secrets {
            insert_secret(&mut tx, tenant.id, secret).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn tenant_by_api_key(&self, hash: &[u8]) -> Result<Option<TenantRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, inbound_signature_required, callback_url, callback_disabled \
             FROM tenants WHERE api_key_hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(tenant_from_row).transpose()?)
    }

    async fn tenant(&self, id: Uuid) -> Result<Option<TenantRecord>, StoreError> {
        let row = sqlx::query(
            "SELECT id, name, inbound_signature_required, callback_url, callback_disabled \
             FROM tenants WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(tenant_from_row).transpose()?)
    }

    async fn live_secrets(
        &self,
        tenant_id: Uuid,
        purpose: SecretPurpose,
        now: i64,
    ) -> Result<Vec<SealedSecret>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, sealed, created_at FROM tenant_secrets \
             WHERE tenant_id = $1 AND purpose = $2 AND (retired_at IS NULL OR retired_at > $3) \
             ORDER BY created_at DESC",
        )
        .bind(tenant_id)
        .bind(purpose.as_str())
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(SealedSecret {
                    id: row.try_get("id")?,
                    purpose,
                    sealed: row.try_get("sealed")?,
                    created_at: row.try_get("created_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    async fn rotate_secret(
        &self,
        tenant_id: Uuid,
        secret: &SealedSecret,
        retire_at: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE tenant_secrets SET retired_at = $3 \
             WHERE tenant_id = $1 AND purpose = $2 AND (retired_at IS NULL OR retired_at > $3)",
        )
        .bind(tenant_id)
        .bind(secret.purpose.as_str())
        .bind(retire_at)
        .execute(&mut *tx)
        .await?;
        insert_secret(&mut tx, tenant_id, secret).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome, StoreError> {
        let key = &claim.key;
        for _ in 0..CLAIM_ATTEMPTS {
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, fingerprint, \
                 state, event_id, lock_token, locked_until, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, 'in_flight', $5, $6, $7, $8, $9) \
                 ON CONFLICT DO NOTHING RETURNING event_id",
            )
            .bind(key.tenant_id)
            .bind(key.endpoint)
            .bind(&key.digest)
            .bind(&claim.fingerprint)
            .bind(claim.event_id)
            .bind(claim.lock_token)
            .bind(claim.locked_until)
            .bind(claim.now)
            .bind(claim.expires_at)
            .fetch_optional(&self.pool)
            .await?;
            if inserted.is_some() {
                return Ok(ClaimOutcome::Started);
            }
            let Some(row) = sqlx::query(
                "SELECT fingerprint, state, event_id, locked_until, action_results, \
                 response_status, response_body, expires_at FROM idempotency_keys \
                 WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3",
            )
            .bind(key.tenant_id)
            .bind(key.endpoint)
            .bind(&key.digest)
            .fetch_optional(&self.pool)
            .await?
            else {
                continue; // pruned between our two statements
            };
            let existing = ExistingKey {
                fingerprint: row.try_get("fingerprint")?,
                state: row.try_get("state")?,
                event_id: row.try_get("event_id")?,
                locked_until: row.try_get("locked_until")?,
                action_results: row.try_get("action_results")?,
                response_status: row.try_get("response_status")?,
                response_body: row.try_get("response_body")?,
                expires_at: row.try_get("expires_at")?,
            };
            let event_id = existing.event_id;
            match judge(existing, claim) {
                Judgement::Final(outcome) => return Ok(outcome),
                Judgement::Expired => {
                    sqlx::query(
                        "DELETE FROM idempotency_keys WHERE tenant_id = $1 AND endpoint = $2 \
                         AND key_digest = $3 AND expires_at <= $4",
                    )
                    .bind(key.tenant_id)
                    .bind(key.endpoint)
                    .bind(&key.digest)
                    .bind(claim.now)
                    .execute(&self.pool)
                    .await?;
                }
                Judgement::TakeOver(from) => {
                    let taken = sqlx::query(
                        "UPDATE idempotency_keys SET lock_token = $4, locked_until = $5 \
                         WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                         AND state <> 'completed' AND locked_until <= $6",
                    )
                    .bind(key.tenant_id)
                    .bind(key.endpoint)
                    .bind(&key.digest)
                    .bind(claim.lock_token)
                    .bind(claim.locked_until)
                    .bind(claim.now)
                    .execute(&self.pool)
                    .await?;
                    return Ok(if taken.rows_affected() == 1 {
                        ClaimOutcome::TakenOver { event_id, from }
                    } else {
                        ClaimOutcome::InProgress
                    });
                }
            }
        }
        Ok(ClaimOutcome::InProgress)
    }

    async fn dispatch(
        &self,
        key: &KeyRef,
        lock_token: Uuid,
        action_results: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(
            "UPDATE idempotency_keys SET state = 'dispatched', action_results = $5 \
             WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 AND lock_token = $4",
        )
        .bind(key.tenant_id)
        .bind(key.endpoint)
        .bind(&key.digest)
        .bind(lock_token)
        .bind(action_results)
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::LockLost)
        }
    }

    async fn complete(&self, completion: &Completion) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        if let Some((key, lock_token)) = &completion.key {
            let done = sqlx::query(
                "UPDATE idempotency_keys SET state = 'completed', response_status = $5, \
                 response_body = $6, lock_token = NULL, locked_until = 0 \
                 WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 AND lock_token = $4",
            )
            .bind(key.tenant_id)
            .bind(key.endpoint)
            .bind(&key.digest)
            .bind(lock_token)
            .bind(i32::from(completion.response.status))
            .bind(&completion.response.body)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::LockLost);
            }
        }
        if let Some(event) = &completion.event {
            sqlx::query(
                "INSERT INTO events (id, tenant_id, signal_type, subject_hash, observed_at, \
                 attributes, metadata, decision, playbook_version, rule, actions, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(event.id)
            .bind(event.tenant_id)
            .bind(event.signal_type)
            .bind(&event.subject_hash)
            .bind(event.observed_at)
            .bind(&event.attributes)
            .bind(&event.metadata)
            .bind(event.decision)
            .bind(event.playbook_version)
            .bind(&event.rule)
            .bind(&event.actions)
            .bind(event.created_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn release(&self, key: &KeyRef, lock_token: Uuid) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE idempotency_keys SET lock_token = NULL, locked_until = 0 \
             WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 AND lock_token = $4",
        )
        .bind(key.tenant_id)
        .bind(key.endpoint)
        .bind(&key.digest)
        .bind(lock_token)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn prune_expired_keys(&self, now: i64) -> Result<u64, StoreError> {
        let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
