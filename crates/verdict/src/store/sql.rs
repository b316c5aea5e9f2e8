//! The SQL both backends run, written once.
//!
//! Every statement here is portable between SQLite and PostgreSQL: `$N` placeholders,
//! `ON CONFLICT DO NOTHING`, `RETURNING`, times as integer milliseconds. The `sql_store!` macro
//! implements [`Store`](super::Store) for a backend that provides three inherent methods:
//! `write()` (the pool writes go through), `read()` (the pool reads go through) and `begin()`
//! (a write transaction). Only connection set-up and what truly differs live in the backend
//! files.

/// Implements `Store` for `$store`, whose connection type is `$conn`, with the shared SQL and
/// the backend's own `$lease_due` statement.
macro_rules! sql_store {
    ($store:ty, $conn:ty, $lease_due:expr) => {
        /// The backend's row type.
        type Row = <<$conn as sqlx::Connection>::Database as sqlx::Database>::Row;

        async fn insert_event(
            conn: &mut $conn,
            event: &$crate::store::NewEvent,
        ) -> Result<(), sqlx::Error> {
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
            .execute(conn)
            .await?;
            Ok(())
        }

        async fn insert_secret(
            conn: &mut $conn,
            tenant_id: uuid::Uuid,
            secret: &$crate::store::SealedSecret,
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

        fn tenant_from_row(row: &Row) -> Result<$crate::store::TenantRecord, sqlx::Error> {
            Ok($crate::store::TenantRecord {
                id: row.try_get("id")?,
                name: row.try_get("name")?,
                inbound_signature_required: row.try_get("inbound_signature_required")?,
                callback_url: row.try_get("callback_url")?,
                callback_disabled: row.try_get("callback_disabled")?,
            })
        }

        /// `Done` when our insert won or an earlier attempt of the same event applied it.
        fn applied(inserted: bool, holder: Option<uuid::Uuid>, ours: uuid::Uuid) -> $crate::actions::Applied {
            if inserted || holder == Some(ours) {
                $crate::actions::Applied::Done
            } else {
                $crate::actions::Applied::AlreadyDone
            }
        }

        fn event_from_row(row: &Row) -> Result<$crate::store::EventRecord, sqlx::Error> {
            Ok($crate::store::EventRecord {
                id: row.try_get("id")?,
                signal_type: row.try_get("signal_type")?,
                subject_hash: row.try_get("subject_hash")?,
                observed_at: row.try_get("observed_at")?,
                attributes: row.try_get("attributes")?,
                metadata: row.try_get("metadata")?,
                decision: row.try_get("decision")?,
                playbook_version: row.try_get("playbook_version")?,
                rule: row.try_get("rule")?,
                actions: row.try_get("actions")?,
                created_at: row.try_get("created_at")?,
            })
        }

        fn delivery_from_row(row: &Row) -> Result<$crate::store::DeliveryRecord, sqlx::Error> {
            Ok($crate::store::DeliveryRecord {
                id: row.try_get("id")?,
                event_id: row.try_get("event_id")?,
                webhook_id: row.try_get("webhook_id")?,
                status: row
                    .try_get::<String, _>("status")?
                    .parse()
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                attempts: row.try_get("attempts")?,
                next_attempt_at: row.try_get("next_attempt_at")?,
                last_error: row.try_get("last_error")?,
                created_at: row.try_get("created_at")?,
                updated_at: row.try_get("updated_at")?,
            })
        }

        fn due_from_row(row: &Row) -> Result<$crate::store::DueDelivery, sqlx::Error> {
            Ok($crate::store::DueDelivery {
                id: row.try_get("id")?,
                tenant_id: row.try_get("tenant_id")?,
                webhook_id: row.try_get("webhook_id")?,
                payload: row.try_get("payload")?,
                retries_left: row.try_get("retries_left")?,
                callback_url: row.try_get("callback_url")?,
            })
        }

        /// An effect held once per subject (a lock, a deny): `insert` takes (tenant, subject,
        /// event, now) and returns the row if it won; `holder` finds the event that holds it.
        async fn once_per_subject(
            pool: &sqlx::Pool<<$conn as sqlx::Connection>::Database>,
            t: &$crate::store::ActionTarget,
            insert: &'static str,
            holder: &'static str,
        ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
            let inserted = sqlx::query(insert)
                .bind(t.tenant_id)
                .bind(&t.subject_hash)
                .bind(t.event_id)
                .bind(t.now)
                .fetch_optional(pool)
                .await?
                .is_some();
            let holder = if inserted {
                None
            } else {
                sqlx::query_scalar(holder)
                    .bind(t.tenant_id)
                    .bind(&t.subject_hash)
                    .fetch_optional(pool)
                    .await?
            };
            Ok(applied(inserted, holder, t.event_id))
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            async fn migrate(&self) -> Result<(), $crate::store::StoreError> {
                MIGRATOR.run(self.write()).await?;
                Ok(())
            }

            async fn ping(&self) -> Result<(), $crate::store::StoreError> {
                sqlx::query("SELECT 1").execute(self.read()).await?;
                Ok(())
            }

            async fn create_tenant(
                &self,
                tenant: &$crate::store::NewTenant,
                secrets: &[$crate::store::SealedSecret],
            ) -> Result<(), $crate::store::StoreError> {
                let mut tx = self.begin().await?;
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

            async fn tenant_by_api_key(
                &self,
                hash: &[u8],
            ) -> Result<Option<$crate::store::TenantRecord>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "SELECT id, name, inbound_signature_required, callback_url, callback_disabled \
                     FROM tenants WHERE api_key_hash = $1",
                )
                .bind(hash)
                .fetch_optional(self.read())
                .await?;
                Ok(row.as_ref().map(tenant_from_row).transpose()?)
            }

            async fn tenant(
                &self,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::store::TenantRecord>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "SELECT id, name, inbound_signature_required, callback_url, callback_disabled \
                     FROM tenants WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(self.read())
                .await?;
                Ok(row.as_ref().map(tenant_from_row).transpose()?)
            }

            async fn live_secrets(
                &self,
                tenant_id: uuid::Uuid,
                purpose: $crate::store::SecretPurpose,
                now: i64,
            ) -> Result<Vec<$crate::store::SealedSecret>, $crate::store::StoreError> {
                let rows = sqlx::query(
                    "SELECT id, sealed, created_at FROM tenant_secrets \
                     WHERE tenant_id = $1 AND purpose = $2 \
                     AND (retired_at IS NULL OR retired_at > $3) ORDER BY created_at DESC",
                )
                .bind(tenant_id)
                .bind(purpose.as_str())
                .bind(now)
                .fetch_all(self.read())
                .await?;
                rows.iter()
                    .map(|row| {
                        Ok($crate::store::SealedSecret {
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
                tenant_id: uuid::Uuid,
                secret: &$crate::store::SealedSecret,
                retire_at: i64,
            ) -> Result<(), $crate::store::StoreError> {
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
                insert_secret(&mut tx, tenant_id, secret).await?;
                tx.commit().await?;
                Ok(())
            }

            async fn claim(
                &self,
                claim: &$crate::store::Claim,
            ) -> Result<$crate::store::ClaimOutcome, $crate::store::StoreError> {
                use $crate::store::{ClaimOutcome, ExistingKey, Judgement, judge};
                let key = &claim.key;
                for _ in 0..$crate::store::CLAIM_ATTEMPTS {
                    let inserted = sqlx::query(
                        "INSERT INTO idempotency_keys (tenant_id, endpoint, key_digest, \
                         fingerprint, state, event_id, lock_token, locked_until, created_at, \
                         expires_at) VALUES ($1, $2, $3, $4, 'in_flight', $5, $6, $7, $8, $9) \
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
                    .fetch_optional(self.write())
                    .await?;
                    if inserted.is_some() {
                        return Ok(ClaimOutcome::Started);
                    }
                    // Read through the write pool: on SQLite a reader could hold a snapshot
                    // older than the row we just conflicted with.
                    let Some(row) = sqlx::query(
                        "SELECT fingerprint, state, event_id, locked_until, action_results, \
                         response_status, response_body, expires_at FROM idempotency_keys \
                         WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3",
                    )
                    .bind(key.tenant_id)
                    .bind(key.endpoint)
                    .bind(&key.digest)
                    .fetch_optional(self.write())
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
                                "DELETE FROM idempotency_keys WHERE tenant_id = $1 \
                                 AND endpoint = $2 AND key_digest = $3 AND expires_at <= $4",
                            )
                            .bind(key.tenant_id)
                            .bind(key.endpoint)
                            .bind(&key.digest)
                            .bind(claim.now)
                            .execute(self.write())
                            .await?;
                        }
                        Judgement::TakeOver(from) => {
                            // Compare-and-set on the lock: of several takers, one wins.
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
                            .execute(self.write())
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
                dispatch: &$crate::store::Dispatch<'_>,
            ) -> Result<Option<$crate::actions::Applied>, $crate::store::StoreError> {
                let target = dispatch.target;
                let mut tx = self.begin().await?;
                let callback = match dispatch.callback {
                    None => None,
                    Some(delivery) => {
                        let inserted = sqlx::query(
                            "INSERT INTO deliveries (id, tenant_id, event_id, signal_key, \
                             webhook_id, payload, status, attempts, next_attempt_at, leased_until, \
                             created_at, updated_at) \
                             VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $8, $7, $7) \
                             ON CONFLICT DO NOTHING RETURNING id",
                        )
                        .bind(delivery.id)
                        .bind(target.tenant_id)
                        .bind(target.event_id)
                        .bind(&target.signal_key)
                        .bind(&delivery.webhook_id)
                        .bind(&delivery.payload)
                        .bind(target.now)
                        .bind(delivery.leased_until)
                        .fetch_optional(&mut *tx)
                        .await?
                        .is_some();
                        let holder = if inserted {
                            None
                        } else {
                            sqlx::query_scalar(
                                "SELECT event_id FROM deliveries \
                                 WHERE tenant_id = $1 AND signal_key = $2",
                            )
                            .bind(target.tenant_id)
                            .bind(&target.signal_key)
                            .fetch_optional(&mut *tx)
                            .await?
                        };
                        Some(applied(inserted, holder, target.event_id))
                    }
                };
                let recorded = (dispatch.record)(callback);
                if let Some((key, lock_token)) = dispatch.key {
                    let done = sqlx::query(
                        "UPDATE idempotency_keys SET state = 'dispatched', action_results = $5 \
                         WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                         AND lock_token = $4",
                    )
                    .bind(key.tenant_id)
                    .bind(key.endpoint)
                    .bind(&key.digest)
                    .bind(lock_token)
                    .bind(&recorded.record)
                    .execute(&mut *tx)
                    .await?;
                    if done.rows_affected() != 1 {
                        return Err($crate::store::StoreError::LockLost);
                    }
                }
                if let Some(event) = &recorded.event {
                    insert_event(&mut tx, event).await?;
                }
                tx.commit().await?;
                Ok(callback)
            }

            async fn complete(
                &self,
                completion: &$crate::store::Completion,
            ) -> Result<(), $crate::store::StoreError> {
                let mut tx = self.begin().await?;
                if let Some((key, lock_token)) = &completion.key {
                    let done = sqlx::query(
                        "UPDATE idempotency_keys SET state = 'completed', response_status = $5, \
                         response_body = $6, lock_token = NULL, locked_until = 0 \
                         WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                         AND lock_token = $4",
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
                        return Err($crate::store::StoreError::LockLost);
                    }
                }
                if let Some(event) = &completion.event {
                    insert_event(&mut tx, event).await?;
                }
                $crate::failpoint::failpoint!("persist::before_commit");
                tx.commit().await?;
                Ok(())
            }

            async fn release(
                &self,
                key: &$crate::store::KeyRef,
                lock_token: uuid::Uuid,
            ) -> Result<(), $crate::store::StoreError> {
                sqlx::query(
                    "UPDATE idempotency_keys SET lock_token = NULL, locked_until = 0 \
                     WHERE tenant_id = $1 AND endpoint = $2 AND key_digest = $3 \
                     AND lock_token = $4",
                )
                .bind(key.tenant_id)
                .bind(key.endpoint)
                .bind(&key.digest)
                .bind(lock_token)
                .execute(self.write())
                .await?;
                Ok(())
            }

            async fn prune_expired_keys(&self, now: i64) -> Result<u64, $crate::store::StoreError> {
                let done = sqlx::query("DELETE FROM idempotency_keys WHERE expires_at <= $1")
                    .bind(now)
                    .execute(self.write())
                    .await?;
                Ok(done.rows_affected())
            }

            async fn current_playbook(
                &self,
                tenant_id: uuid::Uuid,
            ) -> Result<Option<$crate::store::StoredPlaybook>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "SELECT version, format, source, created_at FROM playbooks \
                     WHERE tenant_id = $1 ORDER BY version DESC LIMIT 1",
                )
                .bind(tenant_id)
                .fetch_optional(self.read())
                .await?;
                row.map(|row| {
                    Ok($crate::store::StoredPlaybook {
                        version: row.try_get("version")?,
                        format: row.try_get("format")?,
                        source: row.try_get("source")?,
                        created_at: row.try_get("created_at")?,
                    })
                })
                .transpose()
                .map_err(|e: sqlx::Error| e.into())
            }

            async fn put_playbook(
                &self,
                tenant_id: uuid::Uuid,
                format: &str,
                source: &str,
                now: i64,
            ) -> Result<i64, $crate::store::StoreError> {
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

            async fn subject_locked(
                &self,
                tenant_id: uuid::Uuid,
                subject_hash: &[u8],
            ) -> Result<bool, $crate::store::StoreError> {
                let held: Option<i64> = sqlx::query_scalar(
                    "SELECT locked_at FROM account_locks WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?;
                Ok(held.is_some())
            }

            async fn lock_account(
                &self,
                t: &$crate::store::ActionTarget,
            ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
                once_per_subject(
                    self.write(),
                    t,
                    "INSERT INTO account_locks (tenant_id, subject_hash, event_id, locked_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING event_id",
                    "SELECT event_id FROM account_locks WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .await
            }

            async fn open_case(
                &self,
                t: &$crate::store::ActionTarget,
            ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
                let mut tx = self.begin().await?;
                sqlx::query(
                    "INSERT INTO cases (id, tenant_id, subject_hash, status, opened_by_event, \
                     opened_at) VALUES ($1, $2, $3, 'open', $4, $5) ON CONFLICT DO NOTHING",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(t.tenant_id)
                .bind(&t.subject_hash)
                .bind(t.event_id)
                .bind(t.now)
                .execute(&mut *tx)
                .await?;
                let row = sqlx::query(
                    "SELECT id, opened_by_event FROM cases \
                     WHERE tenant_id = $1 AND subject_hash = $2 AND status = 'open'",
                )
                .bind(t.tenant_id)
                .bind(&t.subject_hash)
                .fetch_one(&mut *tx)
                .await?;
                let case_id: uuid::Uuid = row.try_get("id")?;
                let opener: uuid::Uuid = row.try_get("opened_by_event")?;
                sqlx::query(
                    "INSERT INTO case_events (case_id, event_id, attached_at) \
                     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                )
                .bind(case_id)
                .bind(t.event_id)
                .bind(t.now)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(applied(false, Some(opener), t.event_id))
            }

            async fn alert_customer(
                &self,
                t: &$crate::store::ActionTarget,
                window_ms: i64,
            ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
                let mut tx = self.begin().await?;
                // Claims the window: inserts, or moves an expired window to this event.
                let due = sqlx::query(
                    "INSERT INTO alert_windows (tenant_id, subject_hash, signal_type, event_id, \
                     last_sent_at) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (tenant_id, subject_hash, signal_type) DO UPDATE \
                     SET event_id = excluded.event_id, last_sent_at = excluded.last_sent_at \
                     WHERE alert_windows.last_sent_at <= $6 RETURNING event_id",
                )
                .bind(t.tenant_id)
                .bind(&t.subject_hash)
                .bind(t.signal_type)
                .bind(t.event_id)
                .bind(t.now)
                .bind(t.now.saturating_sub(window_ms))
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
                let holder = if due {
                    sqlx::query(
                        "INSERT INTO alerts (tenant_id, subject_hash, signal_type, event_id, \
                         sent_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    )
                    .bind(t.tenant_id)
                    .bind(&t.subject_hash)
                    .bind(t.signal_type)
                    .bind(t.event_id)
                    .bind(t.now)
                    .execute(&mut *tx)
                    .await?;
                    None
                } else {
                    sqlx::query_scalar(
                        "SELECT event_id FROM alert_windows WHERE tenant_id = $1 \
                         AND subject_hash = $2 AND signal_type = $3",
                    )
                    .bind(t.tenant_id)
                    .bind(&t.subject_hash)
                    .bind(t.signal_type)
                    .fetch_optional(&mut *tx)
                    .await?
                };
                tx.commit().await?;
                Ok(applied(due, holder, t.event_id))
            }

            async fn charge_step_up(
                &self,
                t: &$crate::store::ActionTarget,
            ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
                let inserted = sqlx::query(
                    "INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, \
                     subject_hash, kind, created_at) \
                     VALUES ($1, $2, $3, $4, $5, 'step_up_verification', $6) \
                     ON CONFLICT DO NOTHING RETURNING id",
                )
                .bind(uuid::Uuid::now_v7())
                .bind(t.tenant_id)
                .bind(t.event_id)
                .bind(&t.signal_key)
                .bind(&t.subject_hash)
                .bind(t.now)
                .fetch_optional(self.write())
                .await?
                .is_some();
                let holder = if inserted {
                    None
                } else {
                    sqlx::query_scalar(
                        "SELECT event_id FROM ledger_entries WHERE tenant_id = $1 AND signal_key = $2",
                    )
                    .bind(t.tenant_id)
                    .bind(&t.signal_key)
                    .fetch_optional(self.write())
                    .await?
                };
                Ok(applied(inserted, holder, t.event_id))
            }

            async fn deny_subject(
                &self,
                t: &$crate::store::ActionTarget,
            ) -> Result<$crate::actions::Applied, $crate::store::StoreError> {
                once_per_subject(
                    self.write(),
                    t,
                    "INSERT INTO denies (tenant_id, subject_hash, event_id, issued_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING event_id",
                    "SELECT event_id FROM denies WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .await
            }

            async fn events(
                &self,
                tenant_id: uuid::Uuid,
                before: Option<uuid::Uuid>,
                limit: i64,
            ) -> Result<Vec<$crate::store::EventRecord>, $crate::store::StoreError> {
                // UUIDv7 ids sort by creation time, so the id is the pagination cursor.
                let rows = match before {
                    None => sqlx::query(
                        "SELECT id, signal_type, subject_hash, observed_at, attributes, metadata, \
                         decision, playbook_version, rule, actions, created_at FROM events \
                         WHERE tenant_id = $1 ORDER BY id DESC LIMIT $2",
                    )
                    .bind(tenant_id)
                    .bind(limit)
                    .fetch_all(self.read())
                    .await?,
                    Some(cursor) => sqlx::query(
                        "SELECT id, signal_type, subject_hash, observed_at, attributes, metadata, \
                         decision, playbook_version, rule, actions, created_at FROM events \
                         WHERE tenant_id = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
                    )
                    .bind(tenant_id)
                    .bind(cursor)
                    .bind(limit)
                    .fetch_all(self.read())
                    .await?,
                };
                rows.iter()
                    .map(event_from_row)
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn event(
                &self,
                tenant_id: uuid::Uuid,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::store::EventRecord>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "SELECT id, signal_type, subject_hash, observed_at, attributes, metadata, \
                     decision, playbook_version, rule, actions, created_at FROM events \
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(self.read())
                .await?;
                Ok(row.as_ref().map(event_from_row).transpose()?)
            }

            async fn deliveries_for_event(
                &self,
                tenant_id: uuid::Uuid,
                event_id: uuid::Uuid,
            ) -> Result<Vec<$crate::store::DeliveryRecord>, $crate::store::StoreError> {
                let rows = sqlx::query(
                    "SELECT id, event_id, webhook_id, status, attempts, next_attempt_at, \
                     last_error, created_at, updated_at FROM deliveries \
                     WHERE tenant_id = $1 AND event_id = $2 ORDER BY id",
                )
                .bind(tenant_id)
                .bind(event_id)
                .fetch_all(self.read())
                .await?;
                rows.iter()
                    .map(delivery_from_row)
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn subject(
                &self,
                tenant_id: uuid::Uuid,
                subject_hash: &[u8],
            ) -> Result<Option<$crate::store::SubjectState>, $crate::store::StoreError> {
                let known: Option<uuid::Uuid> = sqlx::query_scalar(
                    "SELECT id FROM events WHERE tenant_id = $1 AND subject_hash = $2 LIMIT 1",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?;
                if known.is_none() {
                    return Ok(None);
                }
                let lock = sqlx::query(
                    "SELECT event_id, locked_at FROM account_locks \
                     WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?
                .map(|r| Ok::<_, sqlx::Error>((r.try_get("event_id")?, r.try_get("locked_at")?)))
                .transpose()?;
                let deny = sqlx::query(
                    "SELECT event_id, issued_at FROM denies WHERE tenant_id = $1 AND subject_hash = $2",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_optional(self.read())
                .await?
                .map(|r| Ok::<_, sqlx::Error>((r.try_get("event_id")?, r.try_get("issued_at")?)))
                .transpose()?;
                let rows = sqlx::query(
                    "SELECT c.id, c.opened_at, e.event_id FROM cases c \
                     JOIN case_events e ON e.case_id = c.id \
                     WHERE c.tenant_id = $1 AND c.subject_hash = $2 AND c.status = 'open' \
                     ORDER BY c.id, e.event_id",
                )
                .bind(tenant_id)
                .bind(subject_hash)
                .fetch_all(self.read())
                .await?;
                let mut open_cases: Vec<(uuid::Uuid, i64, Vec<uuid::Uuid>)> = Vec::new();
                for row in rows {
                    let id: uuid::Uuid = row.try_get("id")?;
                    let event: uuid::Uuid = row.try_get("event_id")?;
                    match open_cases.last_mut() {
                        Some(case) if case.0 == id => case.2.push(event),
                        _ => open_cases.push((id, row.try_get("opened_at")?, vec![event])),
                    }
                }
                Ok(Some($crate::store::SubjectState { lock, open_cases, deny }))
            }

            async fn lease_due(
                &self,
                now: i64,
                since: i64,
                lease_until: i64,
                limit: i64,
            ) -> Result<Vec<$crate::store::DueDelivery>, $crate::store::StoreError> {
                let rows = sqlx::query($lease_due)
                    .bind(now)
                    .bind(lease_until)
                    .bind(limit)
                    .bind(since)
                    .fetch_all(self.write())
                    .await?;
                rows.iter()
                    .map(due_from_row)
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn record_attempt(
                &self,
                a: &$crate::store::AttemptRecord,
            ) -> Result<(), $crate::store::StoreError> {
                let mut tx = self.begin().await?;
                sqlx::query(
                    "INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, \
                     status_code, latency_ms, error, response_excerpt) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(a.id)
                .bind(a.delivery_id)
                .bind(a.attempted_at)
                .bind(a.trigger)
                .bind(a.status_code)
                .bind(a.latency_ms)
                .bind(&a.error)
                .bind(&a.response_excerpt)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE deliveries SET status = $2, attempts = attempts + 1, \
                     retries_left = $3, next_attempt_at = $4, leased_until = 0, last_error = $5, \
                     updated_at = $6 WHERE id = $1",
                )
                .bind(a.delivery_id)
                .bind(a.next.status.as_str())
                .bind(a.next.retries_left)
                .bind(a.next.next_attempt_at)
                .bind(&a.error)
                .bind(a.attempted_at)
                .execute(&mut *tx)
                .await?;
                if a.next.disable_endpoint {
                    sqlx::query("UPDATE tenants SET callback_disabled = TRUE WHERE id = $1")
                        .bind(a.tenant_id)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn lease_for_redelivery(
                &self,
                tenant_id: uuid::Uuid,
                id: uuid::Uuid,
                now: i64,
                lease_until: i64,
                retries: i64,
            ) -> Result<Option<$crate::store::DueDelivery>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "UPDATE deliveries SET status = 'pending', retries_left = $5, \
                     next_attempt_at = $3, leased_until = $4, updated_at = $3 \
                     WHERE tenant_id = $1 AND id = $2 AND leased_until <= $3 \
                     AND NOT (SELECT callback_disabled FROM tenants WHERE tenants.id = deliveries.tenant_id) \
                     RETURNING id, tenant_id, webhook_id, payload, retries_left, \
                     (SELECT callback_url FROM tenants WHERE tenants.id = deliveries.tenant_id) AS callback_url",
                )
                .bind(tenant_id)
                .bind(id)
                .bind(now)
                .bind(lease_until)
                .bind(retries)
                .fetch_optional(self.write())
                .await?;
                Ok(row.as_ref().map(due_from_row).transpose()?)
            }

            async fn deliveries(
                &self,
                tenant_id: uuid::Uuid,
                status: Option<$crate::delivery::DeliveryStatus>,
                before: Option<uuid::Uuid>,
                limit: i64,
            ) -> Result<Vec<$crate::store::DeliveryRecord>, $crate::store::StoreError> {
                // A nil UUID cursor sorts before every v7 id, so "no cursor" is the max UUID.
                let cursor = before.unwrap_or(uuid::Uuid::max());
                let rows = sqlx::query(
                    "SELECT id, event_id, webhook_id, status, attempts, next_attempt_at, \
                     last_error, created_at, updated_at FROM deliveries \
                     WHERE tenant_id = $1 AND ($2 = '' OR status = $2) AND id < $3 \
                     ORDER BY id DESC LIMIT $4",
                )
                .bind(tenant_id)
                .bind(status.map_or("", |s| s.as_str()))
                .bind(cursor)
                .bind(limit)
                .fetch_all(self.read())
                .await?;
                rows.iter()
                    .map(delivery_from_row)
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn delivery(
                &self,
                tenant_id: uuid::Uuid,
                id: uuid::Uuid,
            ) -> Result<Option<$crate::store::DeliveryRecord>, $crate::store::StoreError> {
                let row = sqlx::query(
                    "SELECT id, event_id, webhook_id, status, attempts, next_attempt_at, \
                     last_error, created_at, updated_at FROM deliveries \
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant_id)
                .bind(id)
                .fetch_optional(self.read())
                .await?;
                Ok(row.as_ref().map(delivery_from_row).transpose()?)
            }

            async fn delivery_attempts(
                &self,
                delivery_id: uuid::Uuid,
            ) -> Result<Vec<$crate::store::AttemptRow>, $crate::store::StoreError> {
                let rows = sqlx::query(
                    "SELECT attempted_at, trigger_kind, status_code, latency_ms, error, \
                     response_excerpt FROM delivery_attempts WHERE delivery_id = $1 \
                     ORDER BY attempted_at, id",
                )
                .bind(delivery_id)
                .fetch_all(self.read())
                .await?;
                rows.iter()
                    .map(|row| {
                        Ok($crate::store::AttemptRow {
                            attempted_at: row.try_get("attempted_at")?,
                            trigger: row.try_get("trigger_kind")?,
                            status_code: row.try_get("status_code")?,
                            latency_ms: row.try_get("latency_ms")?,
                            error: row.try_get("error")?,
                            response_excerpt: row.try_get("response_excerpt")?,
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()
                    .map_err(Into::into)
            }

            async fn set_callback(
                &self,
                tenant_id: uuid::Uuid,
                url: Option<&str>,
            ) -> Result<bool, $crate::store::StoreError> {
                let done = sqlx::query(
                    "UPDATE tenants SET callback_url = $2, callback_disabled = FALSE WHERE id = $1",
                )
                .bind(tenant_id)
                .bind(url)
                .execute(self.write())
                .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn queue_depth(&self, now: i64) -> Result<i64, $crate::store::StoreError> {
                let _ = now;
                Ok(sqlx::query_scalar("SELECT COUNT(*) FROM deliveries WHERE status = 'pending'")
                    .fetch_one(self.read())
                    .await?)
            }
        }
    };
}
