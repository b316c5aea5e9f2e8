-- `suspended`: a callback decided while the tenant's endpoint was disabled (after a 410). It is
-- stored with its bytes like any callback but not attempted; re-enabling the endpoint makes it
-- pending (due) again, unless the operator leaves it suspended.
--
-- SQLite cannot change a CHECK constraint, so `deliveries` is rebuilt (as in 0010, with the
-- `sent_at` of 0011); the attempts that refer to it are checked at commit, when its rows are
-- back.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE deliveries_before_0015 AS SELECT * FROM deliveries;

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
    UNIQUE (event_id, action),
    UNIQUE (tenant_id, signal_key, action)
);

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
    attempts, next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left,
    action, connector, sent_at)
SELECT id, tenant_id, event_id, signal_key, webhook_id, payload, status, attempts,
    next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left, action,
    connector, sent_at
FROM deliveries_before_0015;

DROP TABLE deliveries_before_0015;

CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
