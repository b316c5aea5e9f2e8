-- A delivery is one per signal, action and endpoint, and a signal's key is a digest of its
-- subject, type and observation time: unique index entries keyed by that digest land on a
-- random leaf each, so after every checkpoint nearly each one writes a whole page image (about
-- 4,900 WAL bytes per signal on a database of three million signals, docs/benchmarks.md).
-- The observation time is part of the signal's key, so leading the index with it checks
-- exactly what it checked before, and a signal observed about now lands beside the others
-- observed about now. Rows stored before take their event's observation time (an event
-- outlives its deliveries); a way back's request, keyed by its event's id, the id's.
ALTER TABLE deliveries ADD COLUMN observed_at BIGINT NOT NULL DEFAULT 0;
UPDATE deliveries d SET observed_at = e.observed_at FROM events e
    WHERE e.id = d.event_id;
UPDATE deliveries SET observed_at =
    ('x' || lpad(substr(replace(event_id::text, '-', ''), 1, 12), 16, '0'))::bit(64)::bigint
    WHERE signal_key = uuid_send(event_id);
ALTER TABLE deliveries ALTER COLUMN observed_at DROP DEFAULT;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_one_per_signal_action;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_one_per_signal_action
    UNIQUE (tenant_id, observed_at, signal_key, action, endpoint_id);
