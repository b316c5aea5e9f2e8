-- `events_by_subject` led by the event's day (docs/benchmarks.md, thirty-second session).
--
-- Keyed by tenant and subject digest alone, each event's entry landed on a random leaf of an
-- index as large as all the events kept, and on a grown database nearly every leaf is first
-- dirtied since the last checkpoint, so logged whole: 5,133 WAL bytes a signal at 3 million
-- signals (fifteenth session). Led by the day the event was stored, a day's entries go
-- beside each other, in the one day of the retention window that is being written. A subject's
-- events are found with a probe a day (`SqlDb::SUBJECT_EVENT_IDS`), at most the days the
-- tenant has events over: the subject's page and an operator's way back, never a signal.
DROP INDEX events_by_subject;
CREATE INDEX events_by_subject ON events (tenant_id, (created_at / 86400000), subject_hash);
