-- As on PostgreSQL (its 0029, and its 0023 for `webhook_id`): a delivery is one per signal,
-- action and endpoint, which makes it one per event, action and endpoint and its `webhook_id`
-- (derived from the event, action and endpoint) unique, so neither needs an index of its own
-- checking it; lookups by event take a narrow index of the event. Every delivery row then
-- writes two index entries fewer. SQLite cannot drop a constraint, so the table is rebuilt.
CREATE TABLE deliveries_before_0027 AS SELECT * FROM deliveries;

DROP TABLE deliveries;

CREATE TABLE deliveries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL,
    signal_key BLOB NOT NULL,
    webhook_id TEXT NOT NULL,
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
    inline_attempted_at BIGINT,
    inline_status_code INTEGER,
    inline_latency_ms BIGINT,
    inline_error TEXT,
    inline_excerpt BLOB,
    UNIQUE (tenant_id, signal_key, action, endpoint_id)
);

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
    attempts, next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left,
    action, connector, sent_at, endpoint_id, inline_attempted_at, inline_status_code,
    inline_latency_ms, inline_error, inline_excerpt)
SELECT id, tenant_id, event_id, signal_key, webhook_id, payload, status, attempts,
    next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left, action,
    connector, sent_at, endpoint_id, inline_attempted_at, inline_status_code,
    inline_latency_ms, inline_error, inline_excerpt
FROM deliveries_before_0027;

DROP TABLE deliveries_before_0027;

CREATE INDEX deliveries_pending ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
