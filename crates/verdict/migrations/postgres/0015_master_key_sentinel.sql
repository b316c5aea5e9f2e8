-- One value sealed under the master key when the database is first used, so that a process
-- started with another key refuses to start instead of failing every signal it then serves.
CREATE TABLE master_key_sentinel (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    sealed BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);
