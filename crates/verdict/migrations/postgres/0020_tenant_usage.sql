-- Events stored per tenant and UTC day, for the daily quota. Each instance counts what it
-- stores in memory and adds its counts here every few seconds, so the signal path writes
-- nothing more; every instance reads the sums back on the same beat. Days older than
-- yesterday are pruned.
CREATE TABLE tenant_usage (
    tenant_id UUID NOT NULL REFERENCES tenants (id),
    day BIGINT NOT NULL,
    events BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, day)
);
