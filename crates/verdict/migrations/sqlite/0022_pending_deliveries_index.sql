-- Only a pending delivery is ever looked for by when it is due (the worker's lease, the next
-- wake-up, the queue depth), so only pending ones are indexed by it: a delivery settled by
-- its inline attempt, most of them, leaves no entry behind, and the index stays as small as
-- the queue.
DROP INDEX deliveries_due;
CREATE INDEX deliveries_pending ON deliveries (next_attempt_at) WHERE status = 'pending';
