-- A delivery is one per signal, action and endpoint (`deliveries_one_per_signal_action`), and
-- an event is of one signal, so one per event, action and endpoint follows: its own unique
-- index was a second wide entry (event, action, endpoint) for every delivery row version, and
-- the update that records the inline attempt writes a version with every index's entry
-- (`status` is indexed). What looks a delivery up by its event (the event's page, the pruner,
-- a signal's action requests) needs only the event: a narrow index of it, 64 fewer WAL bytes
-- per callback (docs/benchmarks.md, seventeenth session).
CREATE INDEX deliveries_by_event ON deliveries (event_id);
ALTER TABLE deliveries DROP CONSTRAINT deliveries_one_per_event_action;
