-- Action requests: a call to a tenant's connector is a delivery like a callback, in the same
-- outbox with the same attempts, schedule, dead letters and redelivery, told apart by
-- `action` ('callback' for the callback) and `connector` (the connector's name). Each event
-- has at most one delivery per action, and each signal one per action, whatever the number of
-- its events (keys, or none). An action request's payload holds the raw identifier the
-- tenant's system needs, sealed under the master key (the event id and action as associated
-- data), and is erased once the request's outcome is final. `unknown`: an ambiguous outcome
-- of an at-most-once connector, left for an operator.
--
-- SQLite cannot change a table's UNIQUE or CHECK constraints, so `deliveries` is rebuilt; the
-- attempts that refer to it are checked at commit, when its rows are back.
PRAGMA defer_foreign_keys = ON;

CREATE TABLE deliveries_before_0010 AS SELECT * FROM deliveries;

DROP TABLE deliveries;

CREATE TABLE deliveries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL,
    signal_key BLOB NOT NULL,
    webhook_id TEXT NOT NULL UNIQUE,
    payload BLOB NOT NULL,
    status TEXT NOT NULL
        CHECK (status IN ('pending', 'succeeded', 'failed', 'dead', 'unknown')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    leased_until INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    retries_left INTEGER NOT NULL DEFAULT 3,
    action TEXT NOT NULL DEFAULT 'callback',
    connector TEXT,
    UNIQUE (event_id, action),
    UNIQUE (tenant_id, signal_key, action)
);

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
    attempts, next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left)
SELECT id, tenant_id, event_id, signal_key, webhook_id, payload, status, attempts,
    next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left
FROM deliveries_before_0010;

DROP TABLE deliveries_before_0010;

CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
