-- The playbook pruner's guard reads the tenant's events by id over the span in which the
-- version was the newest (postgres/0034), so no index by version is kept for it.
DROP INDEX events_by_playbook_version;
