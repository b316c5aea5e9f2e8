-- Idempotency keys in insertion order. As a WITHOUT ROWID table the rows (about 1 KiB each
-- once completed, three or four to a page) were clustered on the random key digest, so every
-- claim landed in a random full leaf and split it, and the completion grew the row there
-- again: the pages one signal dirtied grew with the table. As a rowid table the rows are
-- appended at the tail and only the short primary-key index entry goes to a random leaf.
CREATE TABLE idempotency_keys_in_order (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    endpoint TEXT NOT NULL,
    key_digest BLOB NOT NULL,
    fingerprint BLOB NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'dispatched', 'completed')),
    event_id BLOB NOT NULL,
    lock_token BLOB,
    locked_until INTEGER NOT NULL,
    action_results TEXT,
    response_status INTEGER,
    response_body BLOB,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    ruling TEXT,
    PRIMARY KEY (tenant_id, endpoint, key_digest)
);

INSERT INTO idempotency_keys_in_order (tenant_id, endpoint, key_digest, fingerprint, state,
    event_id, lock_token, locked_until, action_results, response_status, response_body,
    created_at, expires_at, ruling)
SELECT tenant_id, endpoint, key_digest, fingerprint, state, event_id, lock_token,
    locked_until, action_results, response_status, response_body, created_at, expires_at, ruling
FROM idempotency_keys ORDER BY created_at;

DROP TABLE idempotency_keys;

ALTER TABLE idempotency_keys_in_order RENAME TO idempotency_keys;

CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at);
