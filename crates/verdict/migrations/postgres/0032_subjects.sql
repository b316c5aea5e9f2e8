-- A subject's standing state is one row, `subjects`: its account lock, its standing deny (each
-- the event that applied it, and when) and its open case. Each is held at most once per
-- subject, and the default playbook applies all three to the same signal. As before they were
-- three rows (`account_locks`, `denies`, and the open case found by `cases_one_open_per_subject`):
-- three unique index entries and three `HEAP_CONFIRM` records per signal, about 430 WAL bytes,
-- for what is now a few columns (docs/benchmarks.md, twenty-first session). A case keeps its
-- row in `cases`, inserted plainly: the subject's row, which takes the case's id only when it
-- has none, keeps one case open per subject. A hold lifted or a case closed clears its columns;
-- a row left with nothing is deleted. Older rows move over as they are, and the two tables go:
-- a process of an older version still running fails to lock or deny instead of doing it where
-- nothing reads, but its statements on `cases` alone would still run, so it must be stopped
-- first (docs/scale-out.md, upgrading).
CREATE TABLE subjects (
    tenant_id UUID NOT NULL,
    subject_hash BYTEA NOT NULL,
    locked_by UUID,
    locked_at BIGINT,
    denied_by UUID,
    denied_at BIGINT,
    open_case UUID,
    PRIMARY KEY (tenant_id, subject_hash),
    CHECK ((locked_by IS NULL) = (locked_at IS NULL)),
    CHECK ((denied_by IS NULL) = (denied_at IS NULL))
);
INSERT INTO subjects (tenant_id, subject_hash, locked_by, locked_at, denied_by, denied_at,
    open_case)
SELECT k.tenant_id, k.subject_hash, l.event_id, l.locked_at, d.event_id, d.issued_at, c.id
FROM (SELECT tenant_id, subject_hash FROM account_locks
      UNION SELECT tenant_id, subject_hash FROM denies
      UNION SELECT tenant_id, subject_hash FROM cases WHERE status = 'open') k
LEFT JOIN account_locks l ON l.tenant_id = k.tenant_id AND l.subject_hash = k.subject_hash
LEFT JOIN denies d ON d.tenant_id = k.tenant_id AND d.subject_hash = k.subject_hash
LEFT JOIN cases c ON c.tenant_id = k.tenant_id AND c.subject_hash = k.subject_hash
    AND c.status = 'open';
DROP TABLE account_locks;
DROP TABLE denies;
DROP INDEX cases_one_open_per_subject;
