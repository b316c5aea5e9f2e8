-- As on PostgreSQL (its 0033): no index of `deliveries` names a column that recording an
-- inline success changes. The worker's queue, the pending deliveries by when they are due, is
-- a table of its own kept by triggers on every write of a delivery's status or due time; a
-- delivery made under a lease is queued only if that lease runs out while it is pending (the
-- worker's sweep of `deliveries_by_lease`); the tenant's listing is by id alone, and the
-- statuses that need a look (failed, dead, unknown, suspended) are a generated column,
-- indexed where set.
CREATE TABLE delivery_queue (
    next_attempt_at INTEGER NOT NULL,
    id BLOB NOT NULL,
    tenant_id BLOB NOT NULL,
    PRIMARY KEY (next_attempt_at, id)
) WITHOUT ROWID;
CREATE INDEX delivery_queue_by_tenant ON delivery_queue (tenant_id, id);
INSERT INTO delivery_queue (next_attempt_at, id, tenant_id)
    SELECT next_attempt_at, id, tenant_id FROM deliveries WHERE status = 'pending';

CREATE TRIGGER delivery_queued_on_insert AFTER INSERT ON deliveries
    WHEN NEW.status = 'pending' AND NEW.leased_until <= NEW.created_at
BEGIN
    INSERT INTO delivery_queue (next_attempt_at, id, tenant_id)
        VALUES (NEW.next_attempt_at, NEW.id, NEW.tenant_id);
END;
CREATE TRIGGER delivery_queued_on_update AFTER UPDATE OF status, next_attempt_at ON deliveries
    WHEN (OLD.status = 'pending' OR NEW.status = 'pending')
        AND (OLD.status <> NEW.status OR OLD.next_attempt_at <> NEW.next_attempt_at)
BEGIN
    DELETE FROM delivery_queue WHERE OLD.status = 'pending'
        AND next_attempt_at = OLD.next_attempt_at AND id = OLD.id;
    INSERT OR IGNORE INTO delivery_queue (next_attempt_at, id, tenant_id)
        SELECT NEW.next_attempt_at, NEW.id, NEW.tenant_id WHERE NEW.status = 'pending';
END;
CREATE TRIGGER delivery_queued_on_delete AFTER DELETE ON deliveries
    WHEN OLD.status = 'pending'
BEGIN
    DELETE FROM delivery_queue WHERE next_attempt_at = OLD.next_attempt_at AND id = OLD.id;
END;

DROP INDEX deliveries_pending;
DROP INDEX deliveries_by_tenant;
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, id);
ALTER TABLE deliveries ADD COLUMN troubled_status TEXT GENERATED ALWAYS AS
    (CASE WHEN status IN ('failed', 'dead', 'unknown', 'suspended') THEN status END) VIRTUAL;
CREATE INDEX deliveries_troubled ON deliveries (tenant_id, troubled_status, id)
    WHERE troubled_status IS NOT NULL;

CREATE INDEX deliveries_by_lease ON deliveries (leased_until);
-- Leases that ran out up to `swept_to` (unix ms) were swept into the queue.
CREATE TABLE delivery_sweep (swept_to INTEGER NOT NULL);
INSERT INTO delivery_sweep (swept_to) VALUES (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER));
