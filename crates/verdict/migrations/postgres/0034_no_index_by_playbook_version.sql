-- The playbook pruner's guard, whether an event still names a version, reads the tenant's
-- events by id over the span in which the version was the newest (an event's id is made when
-- its signal is decided, and ids are time-ordered), so no index by version is kept for it:
-- one entry less for every event stored, about 70 WAL bytes a signal (docs/benchmarks.md,
-- twenty-sixth session).
DROP INDEX events_by_playbook_version;
