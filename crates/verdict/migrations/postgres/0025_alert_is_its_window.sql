-- An alert's record is its window row (`alert_windows`: the subject, signal type, event and
-- time of the last alert) and the alerting event's own action outcome. The `alerts` table kept
-- a second copy of each, with two indexes, that nothing read: one row and about 420 bytes of
-- WAL per alerting signal (docs/benchmarks.md). Earlier alerts stay in their events' outcomes.
DROP TABLE alerts;
