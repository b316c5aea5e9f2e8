-- API keys with scopes, and per-tenant rate limits.
-- A tenant has any number of keys, each with one scope (ingest, read or admin), stored only as
-- the SHA-256 of the key. The key each tenant had until now becomes its first admin key, and
-- authentication reads this table alone.

CREATE TABLE api_keys (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    key_hash BYTEA NOT NULL UNIQUE,
    scope TEXT NOT NULL CHECK (scope IN ('ingest', 'read', 'admin')),
    created_at BIGINT NOT NULL,
    last_used_at BIGINT,
    revoked_at BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id, created_at);

INSERT INTO api_keys (id, tenant_id, key_hash, scope, created_at)
SELECT gen_random_uuid(), id, api_key_hash, 'admin', created_at FROM tenants;

ALTER TABLE tenants DROP COLUMN api_key_hash;

-- Requests per second (and burst) for this tenant; NULL: the server's setting applies.
ALTER TABLE tenants ADD COLUMN rate_limit_per_second BIGINT CHECK (rate_limit_per_second > 0);
