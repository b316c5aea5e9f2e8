-- `suspended`: a callback decided while the tenant's endpoint was disabled (after a 410). It is
-- stored with its bytes like any callback but not attempted; re-enabling the endpoint makes it
-- pending (due) again, unless the operator leaves it suspended.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('pending', 'succeeded', 'failed', 'dead', 'unknown', 'suspended'));
