-- Connectors: a tenant's own systems that actions call (an HTTP endpoint, a SCIM service
-- provider). The credential (an HTTP connector's `whsec_` signing secret, a SCIM bearer token)
-- is sealed under a key derived from the master key, bound to the tenant and the name; it is
-- never stored or returned in the clear.
CREATE TABLE connectors (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    name TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('http', 'scim')),
    url TEXT NOT NULL,
    match_attribute TEXT NOT NULL CHECK (match_attribute IN ('userName', 'externalId')),
    guarantee TEXT NOT NULL CHECK (guarantee IN ('exactly_once', 'at_most_once')),
    sealed_credential BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, name)
);
