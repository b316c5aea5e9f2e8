-- Several callback endpoints per tenant, each with its own URL, signing secret, filter and
-- enabled state. The tenant's single callback URL becomes its first endpoint, `default`,
-- whose id is the tenant's own and which signs with the tenant's webhook secrets (its
-- `sealed_secret` is NULL), so existing receivers keep verifying. Every other endpoint has
-- a secret of its own, sealed under the master key.
--
-- A filter is a comma-separated list of names per dimension; an empty one matches all.
CREATE TABLE endpoints (
    id UUID PRIMARY KEY,
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    name TEXT NOT NULL,
    url TEXT NOT NULL,
    sealed_secret BYTEA,
    signal_types TEXT NOT NULL DEFAULT '',
    decisions TEXT NOT NULL DEFAULT '',
    feeds TEXT NOT NULL DEFAULT '',
    disabled BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE (tenant_id, name)
);

INSERT INTO endpoints (id, tenant_id, name, url, disabled, created_at, updated_at)
SELECT id, id, 'default', callback_url, callback_disabled, created_at, created_at
FROM tenants WHERE callback_url IS NOT NULL;

ALTER TABLE tenants DROP COLUMN callback_url;
ALTER TABLE tenants DROP COLUMN callback_disabled;

-- Each callback is one endpoint's: one delivery per event, action and endpoint (and per
-- signal, action and endpoint). An action request goes to its connector, not an endpoint:
-- its `endpoint_id` is the nil id. Callbacks stored before this went to the tenant's one
-- URL, now its `default` endpoint.
ALTER TABLE deliveries
    ADD COLUMN endpoint_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000';
UPDATE deliveries SET endpoint_id = tenant_id WHERE action = 'callback';
ALTER TABLE deliveries DROP CONSTRAINT deliveries_one_per_event_action;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_one_per_signal_action;
ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_one_per_event_action UNIQUE (event_id, action, endpoint_id);
ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_one_per_signal_action
    UNIQUE (tenant_id, signal_key, action, endpoint_id);
