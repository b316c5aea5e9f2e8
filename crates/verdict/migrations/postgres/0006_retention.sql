-- Retention: the pruner deletes events older than the retention window, oldest first, and the
-- playbook versions beyond the newest 50 per tenant that no event names.
CREATE INDEX events_by_created_at ON events (created_at);
CREATE INDEX events_by_playbook_version ON events (tenant_id, playbook_version);
