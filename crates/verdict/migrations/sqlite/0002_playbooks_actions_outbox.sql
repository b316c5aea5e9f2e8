-- Playbooks, the idempotent actions' own tables, and the callback outbox.
-- Every action table has a natural key that makes a repeated action a no-op, and records the
-- event that applied it, so a retry of the same event can tell "done" from "already done".

CREATE TABLE playbooks (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    version INTEGER NOT NULL,
    format TEXT NOT NULL CHECK (format IN ('toml', 'json')),
    source TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

CREATE TABLE account_locks (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subject_hash BLOB NOT NULL,
    event_id BLOB NOT NULL,
    locked_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash)
);

CREATE TABLE cases (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subject_hash BLOB NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    opened_by_event BLOB NOT NULL,
    opened_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX cases_one_open_per_subject ON cases (tenant_id, subject_hash) WHERE status = 'open';

CREATE TABLE case_events (
    case_id BLOB NOT NULL REFERENCES cases (id),
    event_id BLOB NOT NULL,
    attached_at INTEGER NOT NULL,
    PRIMARY KEY (case_id, event_id)
);

CREATE TABLE alerts (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subject_hash BLOB NOT NULL,
    signal_type TEXT NOT NULL,
    event_id BLOB NOT NULL UNIQUE,
    sent_at INTEGER NOT NULL
);
CREATE INDEX alerts_by_subject ON alerts (tenant_id, subject_hash, signal_type, sent_at);

-- The last alert per subject and signal type: the window guard.
CREATE TABLE alert_windows (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subject_hash BLOB NOT NULL,
    signal_type TEXT NOT NULL,
    event_id BLOB NOT NULL,
    last_sent_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash, signal_type)
);

CREATE TABLE ledger_entries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL UNIQUE,
    signal_key BLOB NOT NULL,
    subject_hash BLOB NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (tenant_id, signal_key)
);

CREATE TABLE denies (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subject_hash BLOB NOT NULL,
    event_id BLOB NOT NULL,
    issued_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash)
);

CREATE TABLE deliveries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL UNIQUE,
    signal_key BLOB NOT NULL,
    webhook_id TEXT NOT NULL UNIQUE,
    payload BLOB NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'dead')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    leased_until INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (tenant_id, signal_key)
);
CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
