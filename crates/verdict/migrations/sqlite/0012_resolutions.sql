-- An operator's resolution of an action request whose outcome is `unknown` (to `succeeded` or
-- `failed`), recorded as an attempt of its own kind, `resolve`, with the API key that resolved it
-- (the nil key for the CLI) and why. No call is made: nothing is sent, nothing answers.
--
-- SQLite cannot change a CHECK constraint, so `delivery_attempts` is rebuilt; nothing refers to
-- it.
CREATE TABLE delivery_attempts_before_0012 AS SELECT * FROM delivery_attempts;

DROP TABLE delivery_attempts;

CREATE TABLE delivery_attempts (
    id BLOB PRIMARY KEY,
    delivery_id BLOB NOT NULL REFERENCES deliveries (id),
    attempted_at INTEGER NOT NULL,
    trigger_kind TEXT NOT NULL
        CHECK (trigger_kind IN ('inline', 'worker', 'redeliver', 'resolve')),
    status_code INTEGER,
    latency_ms INTEGER NOT NULL,
    error TEXT,
    response_excerpt BLOB,
    resolved_by BLOB,
    reason TEXT
);

INSERT INTO delivery_attempts (id, delivery_id, attempted_at, trigger_kind, status_code,
    latency_ms, error, response_excerpt)
SELECT id, delivery_id, attempted_at, trigger_kind, status_code, latency_ms, error,
    response_excerpt
FROM delivery_attempts_before_0012;

DROP TABLE delivery_attempts_before_0012;

CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts (delivery_id, attempted_at);
