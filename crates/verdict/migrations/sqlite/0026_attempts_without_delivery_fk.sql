-- As on PostgreSQL (its 0028): attempts no longer refer to their delivery by a foreign key, so
-- deleting a delivery costs no check of its attempts; the pruner deletes a delivery's attempts
-- right after the delivery, in the same transaction. SQLite cannot drop a constraint, so the
-- table is rebuilt; nothing refers to it.
CREATE TABLE delivery_attempts_before_0026 AS SELECT * FROM delivery_attempts;

DROP TABLE delivery_attempts;

CREATE TABLE delivery_attempts (
    id BLOB PRIMARY KEY,
    delivery_id BLOB NOT NULL,
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

INSERT INTO delivery_attempts SELECT * FROM delivery_attempts_before_0026;

DROP TABLE delivery_attempts_before_0026;

CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts (delivery_id, attempted_at);
