-- The growth benchmark's seed (scripts/bench, scenario `growth`): psql -v live=N -v old=M.
-- Copies the one signal the database holds (its key, event and callback delivery, as verdict
-- wrote them) into N live signals spread over the retention window's 90 days, whose keys are
-- unexpired, and M older ones, 91 to 120 days old, whose keys have expired and whose events are
-- past retention: the backlog the pruner works on while the benchmark runs. Each copy has its
-- own key digest, subject, signal key and time-ordered (UUIDv7) ids.
--
-- The secondary indexes are dropped during the load and built again after it (a sorted build,
-- so they come out denser than indexes grown by random inserts would be); the primary keys and
-- unique constraints stay, so a copy that collided would fail the seed.
\set ON_ERROR_STOP on
SET synchronous_commit = off;
SET maintenance_work_mem = '512MB';

CREATE TEMP TABLE t_key AS SELECT * FROM idempotency_keys LIMIT 1;
CREATE TEMP TABLE t_event AS SELECT * FROM events LIMIT 1;
CREATE TEMP TABLE t_delivery AS SELECT * FROM deliveries WHERE action = 'callback' LIMIT 1;
DO $$ BEGIN
    IF (SELECT count(*) FROM t_key) + (SELECT count(*) FROM t_event) + (SELECT count(*) FROM t_delivery) <> 3 THEN
        RAISE EXCEPTION 'the seed copies one signal with a callback; the database holds none';
    END IF;
END $$;

-- i = 1 .. live + old, newest first: live copies from now back over 90 days, then the old ones
-- from 91 days back to 120.
CREATE TEMP TABLE t_seq AS
SELECT i,
       CASE WHEN i <= :live
            THEN now_ms - (i::bigint * 90 * 86400000 / (:live + 1))
            ELSE now_ms - 91 * 86400000::bigint - ((i - :live)::bigint * 29 * 86400000 / (:old + 1))
       END AS at,
       md5(i::text) AS h
FROM generate_series(1, :live + :old) AS i,
     (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms) AS n;

-- Built again below as the migrations left them.
CREATE TEMP TABLE t_index AS SELECT indexname, indexdef FROM pg_indexes
WHERE schemaname = current_schema() AND indexname IN ('idempotency_keys_by_expiry',
    'events_by_created_at', 'events_by_playbook_version', 'events_by_subject', 'events_by_tenant',
    'deliveries_by_tenant', 'deliveries_troubled', 'deliveries_by_lease', 'deliveries_by_event');
DO $$ BEGIN
    IF (SELECT count(*) FROM t_index) <> 9 THEN
        RAISE EXCEPTION 'the seed drops nine secondary indexes; the schema has % of them',
            (SELECT count(*) FROM t_index);
    END IF;
END $$;
DROP INDEX idempotency_keys_by_expiry, events_by_created_at, events_by_playbook_version,
    events_by_subject, events_by_tenant, deliveries_by_tenant, deliveries_troubled,
    deliveries_by_lease, deliveries_by_event;

-- A UUIDv7: 48 bits of unix ms, version 7, the variant, random bits (from the copy's md5).
CREATE FUNCTION pg_temp.v7(at bigint, h text, salt text) RETURNS uuid LANGUAGE sql IMMUTABLE AS
$$ SELECT (lpad(to_hex(at), 12, '0') || '7' || substr(md5(h || salt), 1, 3) || '8'
           || substr(md5(h || salt), 4, 15))::uuid $$;

INSERT INTO events
SELECT pg_temp.v7(s.at, s.h, 'e'), e.tenant_id, e.signal_type, sha256(convert_to(s.h || 's', 'UTF8')),
       s.at, e.attributes, e.metadata, e.decision, e.playbook_version, e.rule, e.actions, s.at,
       s.at, e.facts, e.feed, sha256(convert_to(s.h || 'k', 'UTF8')), e.metadata_in_callback
FROM t_seq s, t_event e ORDER BY s.at;

INSERT INTO deliveries (id, tenant_id, event_id, signal_key, webhook_id, payload, status, attempts,
        next_attempt_at, leased_until, last_error, created_at, updated_at, retries_left, action,
        connector, sent_at, endpoint_id, inline_attempted_at, inline_status_code,
        inline_latency_ms, inline_error, inline_excerpt, observed_at)
SELECT pg_temp.v7(s.at, s.h, 'd'), d.tenant_id, pg_temp.v7(s.at, s.h, 'e'),
       sha256(convert_to(s.h || 'k', 'UTF8')), 'msg_' || s.h, d.payload, 'succeeded', 1, s.at, 0,
       NULL, s.at, s.at, d.retries_left, d.action, d.connector, s.at, d.endpoint_id, s.at, 204, 1,
       NULL, d.inline_excerpt, s.at
FROM t_seq s, t_delivery d ORDER BY s.at;

INSERT INTO idempotency_keys
SELECT k.tenant_id, k.endpoint, sha256(convert_to(s.h, 'UTF8')), k.fingerprint, k.state,
       pg_temp.v7(s.at, s.h, 'e'), k.lock_token, k.locked_until, k.action_results,
       k.response_status, k.response_body, s.at,
       -- Live keys expire a day after the benchmark starts; old ones have expired.
       CASE WHEN s.i <= :live THEN (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 86400000
            ELSE s.at + 86400000 END,
       k.ruling
FROM t_seq s, t_key k ORDER BY s.at;

DO $$ DECLARE def text; BEGIN
    FOR def IN SELECT indexdef FROM t_index ORDER BY indexname LOOP
        EXECUTE def;
    END LOOP;
END $$;
VACUUM ANALYZE idempotency_keys;
VACUUM ANALYZE events;
VACUUM ANALYZE deliveries;
