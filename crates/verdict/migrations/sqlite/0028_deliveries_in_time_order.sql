-- As on PostgreSQL (its 0030): the unique index of a delivery's signal leads with the signal's
-- observation time, which its key digests, so it checks what it checked before and is written
-- in time order rather than on a random page. Rows stored before take their event's
-- observation time (an event outlives its deliveries); a way back's request, keyed by its
-- event's id, the id's own (UUIDv7) milliseconds. SQLite cannot change a constraint, so the
-- table is rebuilt.
CREATE TABLE deliveries_before_0028 AS SELECT * FROM deliveries;

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
    observed_at INTEGER NOT NULL,
    UNIQUE (tenant_id, observed_at, signal_key, action, endpoint_id)
);

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status,
    attempts, next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left,
    action, connector, sent_at, endpoint_id, inline_attempted_at, inline_status_code,
    inline_latency_ms, inline_error, inline_excerpt, observed_at)
SELECT d.id, d.tenant_id, d.event_id, d.signal_key, d.webhook_id, d.payload, d.status,
    d.attempts, d.next_attempt_at, d.leased_until, d.last_error, d.created_at, d.updated_at,
    d.retries_left, d.action, d.connector, d.sent_at, d.endpoint_id, d.inline_attempted_at,
    d.inline_status_code, d.inline_latency_ms, d.inline_error, d.inline_excerpt,
    COALESCE((SELECT e.observed_at FROM events e WHERE e.id = d.event_id), 0)
FROM deliveries_before_0028 d;

DROP TABLE deliveries_before_0028;

-- A way back's request: the first 48 bits of its event's id, in hex.
UPDATE deliveries SET observed_at =
        (instr('0123456789ABCDEF', substr(hex(event_id), 1, 1)) - 1) * 17592186044416 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 2, 1)) - 1) * 1099511627776 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 3, 1)) - 1) * 68719476736 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 4, 1)) - 1) * 4294967296 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 5, 1)) - 1) * 268435456 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 6, 1)) - 1) * 16777216 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 7, 1)) - 1) * 1048576 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 8, 1)) - 1) * 65536 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 9, 1)) - 1) * 4096 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 10, 1)) - 1) * 256 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 11, 1)) - 1) * 16 +
        (instr('0123456789ABCDEF', substr(hex(event_id), 12, 1)) - 1) * 1
    WHERE signal_key = event_id;

CREATE INDEX deliveries_pending ON deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
