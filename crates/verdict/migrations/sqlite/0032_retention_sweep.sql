-- As on PostgreSQL (its 0036): where the pruner's sweep has got to, so that a restarted server
-- resumes it rather than walking every row pruned before.
CREATE TABLE retention_sweep (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    keys_from INTEGER NOT NULL,
    events_from INTEGER NOT NULL,
    keys_left INTEGER,
    events_left INTEGER,
    started_at INTEGER NOT NULL,
    whole_started_at INTEGER NOT NULL
);
