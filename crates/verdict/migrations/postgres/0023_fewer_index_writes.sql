-- Fewer index writes per signal (docs/benchmarks.md, stop 37).
--
-- A dispatched signal's completion rewrites its key row (state, response) and its event row
-- (the calls' outcomes), neither in an indexed column: with room left on the page PostgreSQL
-- keeps the new version there (a HOT update) and writes no index entry. Packed full, about
-- half of them moved to another page and wrote an entry in every index (five on `events`).
ALTER TABLE events SET (fillfactor = 85);
ALTER TABLE idempotency_keys SET (fillfactor = 85);

-- A delivery's `webhook_id` is derived from its event, action and endpoint (`msg_<event>`,
-- `msg_<event>_<endpoint id>`, `<event>:<action>`), which `deliveries_one_per_event_action`
-- already keeps unique, and nothing looks a delivery up by it: its own unique index was a
-- sixth index entry for every delivery row written, and every delivery update writes a
-- new row version (its status is indexed).
ALTER TABLE deliveries DROP CONSTRAINT deliveries_webhook_id_key;

-- Only a pending delivery is ever looked for by when it is due (the worker's lease, the next
-- wake-up, the queue depth), so only pending ones are indexed by it: a delivery settled by
-- its inline attempt, most of them, leaves no entry behind, and the index stays as small as
-- the queue.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_pending ON deliveries (next_attempt_at) WHERE status = 'pending';
