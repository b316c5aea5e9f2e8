-- As on PostgreSQL (its 0031): a step-up charge is one per signal, checked by an index led by
-- the signal's observation time (which its key digests), so entries of signals observed about
-- now are written beside each other. An entry whose event was pruned has no time to take: it
-- moves to `ledger_entries_untimed`, unique by (tenant, signal key), which nothing inserts into
-- any more and which a charge checks first. The column is required, so a process of an older
-- version still running fails to charge instead of charging a signal again. The entry's unique
-- event id goes (one per signal makes it one per event). SQLite cannot drop a constraint, so
-- the table is rebuilt.
CREATE TABLE ledger_entries_before_0029 AS SELECT * FROM ledger_entries;

DROP TABLE ledger_entries;

CREATE TABLE ledger_entries (
    id BLOB PRIMARY KEY,
    tenant_id BLOB NOT NULL REFERENCES tenants (id),
    event_id BLOB NOT NULL,
    signal_key BLOB NOT NULL,
    subject_hash BLOB NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    observed_at INTEGER NOT NULL,
    UNIQUE (tenant_id, observed_at, signal_key)
);

CREATE TABLE ledger_entries_untimed (
    tenant_id BLOB NOT NULL,
    signal_key BLOB NOT NULL,
    event_id BLOB NOT NULL,
    id BLOB NOT NULL,
    subject_hash BLOB NOT NULL,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, signal_key)
);

INSERT INTO ledger_entries (id, tenant_id, event_id, signal_key, subject_hash, kind, created_at,
    observed_at)
SELECT l.id, l.tenant_id, l.event_id, l.signal_key, l.subject_hash, l.kind, l.created_at,
    e.observed_at
FROM ledger_entries_before_0029 l JOIN events e ON e.id = l.event_id;

INSERT INTO ledger_entries_untimed (tenant_id, signal_key, event_id, id, subject_hash, kind,
    created_at)
SELECT l.tenant_id, l.signal_key, l.event_id, l.id, l.subject_hash, l.kind, l.created_at
FROM ledger_entries_before_0029 l
WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.id = l.event_id);

DROP TABLE ledger_entries_before_0029;
