-- Action requests: a call to a tenant's connector is a delivery like a callback, in the same
-- outbox with the same attempts, schedule, dead letters and redelivery, told apart by
-- `action` ('callback' for the callback) and `connector` (the connector's name). Each event
-- has at most one delivery per action, and each signal one per action, whatever the number of
-- its events (keys, or none). An action request's payload holds the raw identifier the
-- tenant's system needs, sealed under the master key (the event id and action as associated
-- data), and is erased once the request's outcome is final. `unknown`: an ambiguous outcome
-- of an at-most-once connector, left for an operator.
ALTER TABLE deliveries ADD COLUMN action TEXT NOT NULL DEFAULT 'callback';
ALTER TABLE deliveries ADD COLUMN connector TEXT;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_id_key;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_tenant_id_signal_key_key;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_one_per_event_action UNIQUE (event_id, action);
ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_one_per_signal_action UNIQUE (tenant_id, signal_key, action);
ALTER TABLE deliveries DROP CONSTRAINT deliveries_status_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_status_check
    CHECK (status IN ('pending', 'succeeded', 'failed', 'dead', 'unknown'));
