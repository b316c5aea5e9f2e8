-- Delivery attempts and the retry budget: one inline attempt, then `retries_left` worker attempts.

ALTER TABLE deliveries ADD COLUMN retries_left BIGINT NOT NULL DEFAULT 3;

CREATE TABLE delivery_attempts (
    id UUID PRIMARY KEY,
    delivery_id UUID NOT NULL REFERENCES deliveries (id),
    attempted_at BIGINT NOT NULL,
    trigger_kind TEXT NOT NULL CHECK (trigger_kind IN ('inline', 'worker', 'redeliver')),
    status_code INTEGER,
    latency_ms BIGINT NOT NULL,
    error TEXT,
    response_excerpt BYTEA
);
CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts (delivery_id, attempted_at);
