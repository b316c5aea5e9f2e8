-- Playbooks, the idempotent actions' own tables, and the callback outbox.
-- Every action table has a natural key that makes a repeated action a no-op, and records the
-- event that applied it, so a retry of the same event can tell "done" from "already done".

CREATE TABLE playbooks (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    version BIGINT NOT NULL,
    format TEXT NOT NULL CHECK (format IN ('toml', 'json')),
    source TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

CREATE TABLE account_locks (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    subject_hash BYTEA NOT NULL,
    event_id UUID NOT NULL,
    locked_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash)
);

CREATE TABLE cases (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    subject_hash BYTEA NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'closed')),
    opened_by_event UUID NOT NULL,
    opened_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX cases_one_open_per_subject ON cases (tenant_id, subject_hash) WHERE status = 'open';

CREATE TABLE case_events (
    case_id UUID NOT NULL REFERENCES cases (id),
    event_id UUID NOT NULL,
    attached_at BIGINT NOT NULL,
    PRIMARY KEY (case_id, event_id)
);

CREATE TABLE alerts (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    subject_hash BYTEA NOT NULL,
    signal_type TEXT NOT NULL,
    event_id UUID NOT NULL UNIQUE,
    sent_at BIGINT NOT NULL
);
CREATE INDEX alerts_by_subject ON alerts (tenant_id, subject_hash, signal_type, sent_at);

-- The last alert per subject and signal type: the window guard.
CREATE TABLE alert_windows (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    subject_hash BYTEA NOT NULL,
    signal_type TEXT NOT NULL,
    event_id UUID NOT NULL,
    last_sent_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash, signal_type)
);

CREATE TABLE ledger_entries (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    event_id UUID NOT NULL UNIQUE,
    signal_key BYTEA NOT NULL,
    subject_hash BYTEA NOT NULL,
    kind TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (tenant_id, signal_key)
);

CREATE TABLE denies (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    subject_hash BYTEA NOT NULL,
    event_id UUID NOT NULL,
    issued_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, subject_hash)
);

CREATE TABLE deliveries (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    event_id UUID NOT NULL UNIQUE,
    signal_key BYTEA NOT NULL,
    webhook_id TEXT NOT NULL UNIQUE,
    payload BYTEA NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'succeeded', 'failed', 'dead')),
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    leased_until BIGINT NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, signal_key)
);
CREATE INDEX deliveries_due ON deliveries (status, next_attempt_at);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, status, id);
