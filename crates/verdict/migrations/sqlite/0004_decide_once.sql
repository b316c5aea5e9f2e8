-- Pipeline v2: a key's decision is recorded on the claim, and each event keeps what its decision
-- evaluated (the subject facts and the evaluation time), so retries, takeovers and simulations
-- see exactly the decision that was made.
ALTER TABLE idempotency_keys ADD COLUMN ruling TEXT;
ALTER TABLE events ADD COLUMN evaluated_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE events ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';
-- A released lock keeps its token (only `locked_until` drops), so a takeover can compare-and-set
-- on the exact token it read.
UPDATE idempotency_keys SET lock_token = randomblob(16) WHERE lock_token IS NULL AND state <> 'completed';
