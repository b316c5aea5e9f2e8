-- API keys with scopes, and per-tenant rate limits.
-- A tenant has any number of keys, each with one scope (ingest, read or admin), stored only as
-- the SHA-256 of the key. The key each tenant had until now becomes its first admin key, and
-- authentication reads this table alone.

CREATE TABLE api_keys (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    key_hash BLOB NOT NULL UNIQUE,
    scope TEXT NOT NULL CHECK (scope IN ('ingest', 'read', 'admin')),
    created_at INTEGER NOT NULL,
    last_used_at INTEGER,
    revoked_at INTEGER
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

INSERT INTO api_keys (id, tenant_id, key_hash, scope, created_at)
SELECT randomblob(16), id, api_key_hash, 'admin', created_at FROM tenants;

-- SQLite cannot drop a UNIQUE column, so `tenants` is rebuilt without `api_key_hash`. Inside
-- this migration's transaction the foreign keys that point at it are checked at commit: the
-- rows the DROP takes away are back by then, and a child row left without its tenant would fail
-- the commit.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE tenants_before_0005 AS
SELECT id, name, inbound_signature_required, callback_url, callback_disabled, created_at
FROM tenants;

DROP TABLE tenants;

CREATE TABLE tenants (
    id BLOB PRIMARY KEY,
    name TEXT NOT NULL,
    inbound_signature_required BOOLEAN NOT NULL,
    callback_url TEXT,
    callback_disabled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at INTEGER NOT NULL,
    -- Requests per second (and burst) for this tenant; NULL: the server's setting applies.
    rate_limit_per_second INTEGER CHECK (rate_limit_per_second > 0)
);

INSERT INTO tenants (id, name, inbound_signature_required, callback_url, callback_disabled, created_at)
SELECT id, name, inbound_signature_required, callback_url, callback_disabled, created_at
FROM tenants_before_0005;

DROP TABLE tenants_before_0005;
