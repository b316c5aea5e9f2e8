-- A delivery is inserted pending and updated once its inline attempt answers, a moment later.
-- When the new version lands on the old one's page, PostgreSQL logs only the bytes that
-- changed (the common prefix and suffix are left out), and the prefix is the envelope; on a
-- full page the new version goes elsewhere and is logged whole, envelope included, with a lock
-- record for the old one. Half of each new page is left for those updates: 509 fewer WAL bytes
-- per signal with a callback (docs/benchmarks.md, fourteenth session). The status update is
-- never HOT (`status` is indexed), so this buys the smaller record, not fewer index entries.
ALTER TABLE deliveries SET (fillfactor = 50);
