-- The update that records a callback's inline attempt stays on its page (postgres/0027) and in
-- place (postgres/0033), and PostgreSQL then logs only the new row's bytes between the longest
-- prefix and the longest suffix it shares with the old one. That update changes the status, the
-- attempt count, the due and update times and the inline attempt's columns, which were spread
-- from the 7th column to the 23rd with the event's endpoint, action, creation time and more
-- between them: about 200 WAL bytes a signal (docs/benchmarks.md, twenty-seventh session). The
-- table is written again with the columns that update leaves alone first and those it changes
-- last, so the stretch logged is those alone. Every constraint, index, trigger and setting is
-- made again as it was; nothing refers to this table's rows by position.
LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE;

CREATE TABLE deliveries_reordered (
    -- Left alone by every attempt.
    id UUID NOT NULL,
    tenant_id UUID NOT NULL,
    event_id UUID NOT NULL,
    endpoint_id UUID NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    observed_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    -- Left alone by an inline attempt (a success keeps its lease's end).
    retries_left BIGINT NOT NULL DEFAULT 3,
    leased_until BIGINT NOT NULL DEFAULT 0,
    signal_key BYTEA NOT NULL,
    webhook_id TEXT NOT NULL,
    action TEXT NOT NULL DEFAULT 'callback',
    connector TEXT,
    payload BYTEA NOT NULL,
    sent_at BIGINT,
    last_error TEXT,
    -- Changed by an inline attempt.
    next_attempt_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    attempts BIGINT NOT NULL DEFAULT 0,
    inline_attempted_at BIGINT,
    inline_latency_ms BIGINT,
    inline_status_code INTEGER,
    status TEXT NOT NULL,
    inline_excerpt BYTEA,
    inline_error TEXT,
    troubled_status TEXT GENERATED ALWAYS AS
        (CASE WHEN status IN ('failed', 'dead', 'unknown', 'suspended') THEN status END) STORED,
    CONSTRAINT deliveries_status_check CHECK
        (status IN ('pending', 'succeeded', 'failed', 'dead', 'unknown', 'suspended'))
) WITH (fillfactor = 50);

INSERT INTO deliveries_reordered (id, tenant_id, event_id, endpoint_id, observed_at, created_at,
        retries_left, leased_until, signal_key, webhook_id, action, connector, payload, sent_at,
        last_error, next_attempt_at, updated_at, attempts, inline_attempted_at,
        inline_latency_ms, inline_status_code, status, inline_excerpt, inline_error)
    SELECT id, tenant_id, event_id, endpoint_id, observed_at, created_at, retries_left,
        leased_until, signal_key, webhook_id, action, connector, payload, sent_at, last_error,
        next_attempt_at, updated_at, attempts, inline_attempted_at, inline_latency_ms,
        inline_status_code, status, inline_excerpt, inline_error
    FROM deliveries ORDER BY id;

-- The old table's indexes and triggers go with it; the queue's function stays.
DROP TABLE deliveries;
ALTER TABLE deliveries_reordered RENAME TO deliveries;

ALTER TABLE deliveries ADD CONSTRAINT deliveries_pkey PRIMARY KEY (id);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_one_per_signal_action
    UNIQUE (tenant_id, observed_at, signal_key, action, endpoint_id);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX deliveries_by_lease ON deliveries (leased_until);
CREATE INDEX deliveries_by_tenant ON deliveries (tenant_id, id);
CREATE INDEX deliveries_troubled ON deliveries (tenant_id, troubled_status, id)
    WHERE troubled_status IS NOT NULL;

CREATE TRIGGER delivery_queued_on_insert AFTER INSERT ON deliveries
    FOR EACH ROW WHEN (NEW.status = 'pending' AND NEW.leased_until <= NEW.created_at)
    EXECUTE FUNCTION delivery_queued();
CREATE TRIGGER delivery_queued_on_update AFTER UPDATE OF status, next_attempt_at ON deliveries
    FOR EACH ROW WHEN ((OLD.status = 'pending' OR NEW.status = 'pending')
        AND (OLD.status <> NEW.status OR OLD.next_attempt_at <> NEW.next_attempt_at))
    EXECUTE FUNCTION delivery_queued();
CREATE TRIGGER delivery_queued_on_delete AFTER DELETE ON deliveries
    FOR EACH ROW WHEN (OLD.status = 'pending') EXECUTE FUNCTION delivery_queued();

ANALYZE deliveries;
