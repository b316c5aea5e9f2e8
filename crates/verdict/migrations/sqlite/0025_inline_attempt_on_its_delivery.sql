-- A delivery's inline attempt, the one made right after the commit that stored it (at most one
-- per delivery), is recorded on the delivery row by the update that moves the delivery on,
-- instead of as a `delivery_attempts` row: that row, its two index entries and the lock its
-- foreign key took on the delivery were a tenth of a fresh signal's WAL (docs/benchmarks.md).
-- The worker's attempts, redeliveries and resolutions stay rows; so do inline attempts
-- recorded before this. A delivery's attempts are both, oldest first.
ALTER TABLE deliveries ADD COLUMN inline_attempted_at BIGINT;
ALTER TABLE deliveries ADD COLUMN inline_status_code INTEGER;
ALTER TABLE deliveries ADD COLUMN inline_latency_ms BIGINT;
ALTER TABLE deliveries ADD COLUMN inline_error TEXT;
ALTER TABLE deliveries ADD COLUMN inline_excerpt BLOB;
