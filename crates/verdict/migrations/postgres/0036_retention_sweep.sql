-- Where the pruner's sweep has got to (`store/sweep.rs`): a restarted server resumes it. A sweep
-- from the oldest rows walks, until a vacuum, the index entries of every row pruned before,
-- which made the first batch after each start, and every resweep, the longest.
CREATE TABLE retention_sweep (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    keys_from BIGINT NOT NULL,
    events_from BIGINT NOT NULL,
    keys_left BIGINT,
    events_left BIGINT,
    started_at BIGINT NOT NULL,
    whole_started_at BIGINT NOT NULL
);
