-- Standard feeds: Security Event Tokens (RFC 8417, pushed per RFC 8935) and CAMARA SIM Swap
-- notifications land in the same pipeline as signals. Each event records the feed it came in
-- through; each tenant may have one SET transmitter and any number of CAMARA subscriptions.

ALTER TABLE events ADD COLUMN feed TEXT NOT NULL DEFAULT 'signals'
    CHECK (feed IN ('signals', 'set', 'camara'));

-- The transmitter whose SETs a tenant accepts: its issuer, the audience its SETs must name, and
-- its signing keys, given once as a JWKS document or fetched from a URL (never both).
CREATE TABLE set_transmitters (
    tenant_id BLOB PRIMARY KEY REFERENCES tenants (id),
    issuer TEXT NOT NULL,
    audience TEXT NOT NULL,
    jwks TEXT,
    jwks_url TEXT,
    updated_at INTEGER NOT NULL,
    CHECK ((jwks IS NULL) <> (jwks_url IS NULL))
);

-- A CAMARA subscription whose notifications may omit the phone number (3-legged): the
-- subscription id and the phone are both kept only as keyed digests, the phone as the subject
-- digest the pipeline decides on.
CREATE TABLE camara_subscriptions (
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    subscription_digest BLOB NOT NULL,
    subject_hash BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, subscription_digest)
) WITHOUT ROWID;
