-- Console sessions: the cookie holds a random token, and only its SHA-256 is stored here, so a
-- database dump cannot sign anyone in. A session belongs to the API key it was opened with and
-- works only while that key is unrevoked; sign-out deletes its row, the pruner the expired ones.
CREATE TABLE console_sessions (
    id_hash BYTEA PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    api_key_id UUID NOT NULL REFERENCES api_keys (id),
    scope TEXT NOT NULL CHECK (scope IN ('read', 'admin')),
    created_at BIGINT NOT NULL,
    -- The absolute end, whatever the use.
    expires_at BIGINT NOT NULL,
    -- The end unless it is used again first: moved on by use, never past `expires_at`.
    idle_until BIGINT NOT NULL CHECK (idle_until <= expires_at)
);
CREATE INDEX console_sessions_by_idle_until ON console_sessions (idle_until);
CREATE INDEX console_sessions_by_key ON console_sessions (api_key_id);
