-- A grown step-up ledger for bench/wal/by-relation.sh (SEED=bench/wal/seed-ledger.sql
-- SEED_ROWS=N): N earlier charges per tenant, observed over the 90 days before now, oldest
-- first, each with its own signal key and subject and time-ordered (UUIDv7) ids, in whichever
-- layout the database has (with `observed_at` since postgres/0031, without it before), so an
-- older build can be measured on the same ledger. No events: only the ledger is grown.
\set ON_ERROR_STOP on
SET synchronous_commit = off;
SET maintenance_work_mem = '512MB';

CREATE FUNCTION pg_temp.v7(at bigint, h text, salt text) RETURNS uuid LANGUAGE sql IMMUTABLE AS
$$ SELECT (lpad(to_hex(at), 12, '0') || '7' || substr(md5(h || salt), 1, 3) || '8'
           || substr(md5(h || salt), 4, 15))::uuid $$;

CREATE TEMP TABLE t_seq AS
SELECT t.id AS tenant_id, n.now_ms - ((:rows - i)::bigint * 90 * 86400000 / :rows) AS at,
       md5(t.id::text || i::text) AS h
FROM tenants t, generate_series(1, :rows) AS i,
     (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) AS n;

SELECT EXISTS (SELECT 1 FROM information_schema.columns
               WHERE table_name = 'ledger_entries' AND column_name = 'observed_at') AS timed \gset
\if :timed
INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, kind, created_at,
    observed_at)
SELECT pg_temp.v7(at, h, 'l'), tenant_id, pg_temp.v7(at, h, 'e'),
       sha256(convert_to(h || 'k', 'UTF8')), sha256(convert_to(h || 's', 'UTF8')),
       'step_up_verification', at, at
FROM t_seq ORDER BY at;
\else
INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, kind, created_at)
SELECT pg_temp.v7(at, h, 'l'), tenant_id, pg_temp.v7(at, h, 'e'),
       sha256(convert_to(h || 'k', 'UTF8')), sha256(convert_to(h || 's', 'UTF8')),
       'step_up_verification', at
FROM t_seq ORDER BY at;
\endif
VACUUM ANALYZE ledger_entries;
