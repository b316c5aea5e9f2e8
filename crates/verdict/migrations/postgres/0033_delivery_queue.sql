-- The update that records a callback's inline attempt (pending to succeeded, most of them)
-- wrote a new entry in each of `deliveries`' four indexes, about 390 WAL bytes per signal:
-- PostgreSQL updates a row in place (HOT) only when no index names a changed column, predicate
-- included, and `status` was in `deliveries_by_tenant` and in the predicate of
-- `deliveries_pending`, and `leased_until` is cleared by it (docs/benchmarks.md,
-- twenty-second session). So no index of `deliveries` names a column that update changes:
--
-- * The worker's queue, the pending deliveries by when they are due, is a narrow table of its
--   own, kept by the triggers below on every write of a delivery's status or due time, so no
--   statement can forget it. A delivery made under a lease (an inline attempt's, a connector
--   call's) is not queued when it is made, since its holder settles it at once, nearly always:
--   it is queued when its lease runs out while it is still pending (the holder died), by the
--   worker's sweep of `deliveries_by_lease` since the last sweep (`delivery_sweep`). An inline
--   success keeps its lease's end, so that update changes no indexed column.
-- * The tenant's listing is by id alone; the statuses a delivery rests in when something
--   needs a look (failed, dead, unknown, suspended) are a generated column, indexed where set.
--   Pending to succeeded leaves it NULL.
--
-- No delivery may change between the queue's fill below and its triggers.
LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE;
CREATE TABLE delivery_queue (
    next_attempt_at BIGINT NOT NULL,
    id UUID NOT NULL,
    tenant_id UUID NOT NULL,
    PRIMARY KEY (next_attempt_at, id)
);
-- A tenant's pending listing and queue depth: its own rows, not the whole queue's.
CREATE INDEX delivery_queue_by_tenant ON delivery_queue (tenant_id, id);
INSERT INTO delivery_queue (next_attempt_at, id, tenant_id)
    SELECT next_attempt_at, id, tenant_id FROM deliveries WHERE status = 'pending';

CREATE FUNCTION delivery_queued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status = 'pending' THEN
        DELETE FROM delivery_queue WHERE next_attempt_at = OLD.next_attempt_at AND id = OLD.id;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status = 'pending' THEN
        INSERT INTO delivery_queue (next_attempt_at, id, tenant_id)
            VALUES (NEW.next_attempt_at, NEW.id, NEW.tenant_id) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER delivery_queued_on_insert AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.status = 'pending' AND NEW.leased_until <= NEW.created_at)
    EXECUTE FUNCTION delivery_queued();
CREATE TRIGGER delivery_queued_on_update AFTER UPDATE OF status, next_attempt_at ON deliveries
    FOR EACH ROW WHEN ((OLD.status = 'pending' OR NEW.status = 'pending')
        AND (OLD.status <> NEW.status OR OLD.next_attempt_at <> NEW.next_attempt_at))
    EXECUTE FUNCTION delivery_queued();
CREATE TRIGGER delivery_queued_on_delete AFTER DELETE ON deliveries
    FOR EACH ROW WHEN (OLD.status = 'pending') EXECUTE FUNCTION delivery_queued();

DROP INDEX deliveries_pending;
DROP INDEX deliveries_by_tenant;
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, id);
ALTER TABLE deliveries ADD COLUMN troubled_status TEXT GENERATED ALWAYS AS
    (CASE WHEN status IN ('failed', 'dead', 'unknown', 'suspended') THEN status END) STORED;
CREATE INDEX deliveries_troubled ON deliveries (tenant_id, troubled_status, id)
    WHERE troubled_status IS NOT NULL;

CREATE INDEX deliveries_by_lease ON deliveries (leased_until);
-- Leases that ran out up to `swept_to` (unix ms) were swept into the queue.
CREATE TABLE delivery_sweep (swept_to BIGINT NOT NULL);
INSERT INTO delivery_sweep (swept_to) VALUES ((extract(epoch FROM clock_timestamp()) * 1000)::bigint);
