-- Several callback endpoints per tenant, each with its own URL, signing secret, filter and
-- enabled state. The tenant's single callback URL becomes its first endpoint, `default`,
-- whose id is the tenant's own and which signs with the tenant's webhook secrets (its
-- `sealed_secret` is NULL), so existing receivers keep verifying. Every other endpoint has
-- a secret of its own, sealed under the master key.
--
-- A filter is a comma-separated list of names per dimension; an empty one matches all.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE endpoints (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    sealed_secret BLOB,
    signal_types TEXT NOT NULL DEFAULT '',
    decisions TEXT NOT NULL DEFAULT '',
    feeds TEXT NOT NULL DEFAULT '',
    disabled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (tenant_id, name)
);

INSERT INTO endpoints (id, tenant_id, name, url, disabled, created_at, updated_at)
SELECT id, id, 'default', callback_url, callback_disabled, created_at, created_at
FROM tenants WHERE callback_url IS NOT NULL;

ALTER TABLE tenants DROP COLUMN callback_url;
ALTER TABLE tenants DROP COLUMN callback_disabled;

-- Each callback is one endpoint's: one delivery per event, action and endpoint (and per
-- signal, action and endpoint). An action request goes to its connector, not an endpoint:
-- its `endpoint_id` is the nil id. Callbacks stored before this went to the tenant's one
-- URL, now its `default` endpoint. SQLite cannot change a table's UNIQUE constraints, so
-- `deliveries` is rebuilt (as in 0015); the attempts that refer to it are checked at commit.
CREATE TABLE deliveries_before_0020 AS SELECT * FROM deliveries;

DROP TABLE deliveries;

CREATE TABLE deliveries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL,
    signal_key BLOB NOT NULL,
    webhook_id TEXT NOT NULL UNIQUE,
    payload BLOB NOT NULL,
    status TEXT NOT NULL
        CHECK (status IN ('pending', 'succeeded', 'failed', 'dead', 'unknown', 'suspended')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    leased_until INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    retries_left INTEGER NOT NULL DEFAULT 3,
    action TEXT NOT NULL DEFAULT 'callback',
    connector TEXT,
    sent_at INTEGER,
    endpoint_id BLOB NOT NULL DEFAULT x'00000000000000000000000000000000',
    UNIQUE (event_id, action, endpoint_id),
    UNIQUE (tenant_id, signal_key, action, endpoint_id)
);

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
    attempts, next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left,
    action, connector, sent_at, endpoint_id)
SELECT id, tenant_id, event_id, signal_key, webhook_id, payload, status, attempts,
    next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left, action,
    connector, sent_at,
    CASE WHEN action = 'callback' THEN tenant_id ELSE x'00000000000000000000000000000000' END
FROM deliveries_before_0020;

DROP TABLE deliveries_before_0020;

CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
