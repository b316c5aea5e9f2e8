-- As on PostgreSQL (its 0032): a subject's standing state is one row, its account lock, its
-- standing deny and its open case. A case keeps its row in `cases`; the subject's row, which
-- takes the case's id only when it has none, keeps one case open per subject. A hold lifted or
-- a case closed clears its columns; a row left with nothing is deleted.
CREATE TABLE subjects (
    tenant_id BLOB NOT NULL,
    subject_hash BLOB NOT NULL,
    locked_by BLOB,
    locked_at INTEGER,
    denied_by BLOB,
    denied_at INTEGER,
    open_case BLOB,
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
