-- The tables a signal writes no longer check their tenant against `tenants` on every row.
--
-- A foreign-key check takes a FOR KEY SHARE lock on the referenced row. Every signal's rows
-- point at the same tenant row, so every concurrent transaction of that tenant locks it, and
-- several lockers of one row make PostgreSQL build a MultiXact for each new one: eight such
-- checks per signal, all on one row. Tenants are never deleted, and every tenant id written here
-- comes from a request that authenticated as that tenant a moment before, so the checks
-- guarded nothing. The references between the pipeline's own rows (attempts to deliveries,
-- case events to cases) stay: they guard what retention deletes.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_tenant_id_fkey;
ALTER TABLE events DROP CONSTRAINT events_tenant_id_fkey;
ALTER TABLE account_locks DROP CONSTRAINT account_locks_tenant_id_fkey;
ALTER TABLE cases DROP CONSTRAINT cases_tenant_id_fkey;
ALTER TABLE alerts DROP CONSTRAINT alerts_tenant_id_fkey;
ALTER TABLE alert_windows DROP CONSTRAINT alert_windows_tenant_id_fkey;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_tenant_id_fkey;
ALTER TABLE denies DROP CONSTRAINT denies_tenant_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_tenant_id_fkey;
