-- Tenants, their sealed secrets, the idempotency key table and events.
-- Times are unix milliseconds. No raw identifier is ever stored: keys and subjects are keyed digests.

CREATE TABLE tenants (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    api_key_hash BYTEA NOT NULL UNIQUE,
    inbound_signature_required BOOLEAN NOT NULL,
    callback_url TEXT,
    callback_disabled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL
);

CREATE TABLE tenant_secrets (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    purpose TEXT NOT NULL CHECK (purpose IN ('inbound', 'webhook')),
    sealed BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    retired_at BIGINT
);
CREATE INDEX tenant_secrets_by_tenant ON tenant_secrets (tenant_id, purpose);

CREATE TABLE idempotency_keys (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    endpoint TEXT NOT NULL,
    key_digest BYTEA NOT NULL,
    fingerprint BYTEA NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('in_flight', 'dispatched', 'completed')),
    event_id UUID NOT NULL,
    lock_token UUID,
    locked_until BIGINT NOT NULL,
    action_results TEXT,
    response_status INTEGER,
    response_body BYTEA,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, endpoint, key_digest)
);
CREATE INDEX idempotency_keys_by_expiry ON idempotency_keys (expires_at);

CREATE TABLE events (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    signal_type TEXT NOT NULL,
    subject_hash BYTEA NOT NULL,
    observed_at BIGINT NOT NULL,
    attributes TEXT NOT NULL,
    metadata TEXT NOT NULL,
    decision TEXT NOT NULL,
    playbook_version BIGINT NOT NULL,
    rule TEXT NOT NULL,
    actions TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX events_by_tenant ON events (tenant_id, id);
CREATE INDEX events_by_subject ON events (tenant_id, subject_hash);
