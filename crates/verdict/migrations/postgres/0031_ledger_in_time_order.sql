-- A step-up charge is one per signal (`UNIQUE (tenant_id, signal_key)`), and a signal's key is a
-- digest of its subject, type and observation time: entries keyed by that digest land on a
-- random leaf each, which on a grown database writes a whole page image after nearly every
-- checkpoint, as the callback's uniqueness did before 0030. Led by the observation time, the
-- index checks exactly what it checked before and a signal observed about now lands beside
-- the others observed about now.
--
-- An entry outlives its event (retention keeps it, so a signal sent again after its event was
-- pruned is not charged twice), and an entry whose event is gone has no time to take: it moves
-- to `ledger_entries_untimed`, unique by (tenant, signal key), which nothing inserts into any
-- more and which a charge checks before inserting. The column then has no default and no
-- NULL: a process of an older version still running inserts without it and fails, instead of
-- charging a signal again.
--
-- The entry's own unique event id goes: one per signal makes it one per event (an event is of
-- one signal), and nothing looks an entry up by its event. Both old uniques go first, so the
-- rewrite of every row below maintains neither (the table is locked until the end, and what
-- it holds is already unique).
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_tenant_id_signal_key_key;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_event_id_key;
ALTER TABLE ledger_entries ADD COLUMN observed_at BIGINT;
UPDATE ledger_entries l SET observed_at = e.observed_at FROM events e WHERE e.id = l.event_id;
CREATE TABLE ledger_entries_untimed (
    tenant_id UUID NOT NULL,
    signal_key BYTEA NOT NULL,
    event_id UUID NOT NULL,
    id UUID NOT NULL,
    subject_hash BYTEA NOT NULL,
    kind TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, signal_key)
);
INSERT INTO ledger_entries_untimed (tenant_id, signal_key, event_id, id, subject_hash, kind,
    created_at)
SELECT tenant_id, signal_key, event_id, id, subject_hash, kind, created_at
FROM ledger_entries WHERE observed_at IS NULL;
DELETE FROM ledger_entries WHERE observed_at IS NULL;
ALTER TABLE ledger_entries ALTER COLUMN observed_at SET NOT NULL;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_one_per_signal
    UNIQUE (tenant_id, observed_at, signal_key);
