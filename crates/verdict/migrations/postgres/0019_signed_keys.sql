-- Whether a tenant's inbound signatures must cover the idempotency key (`Verdict-Signature: v2`
-- or Standard Webhooks), so that captured bytes cannot be replayed under a new key. Tenants
-- created from now on require it; those created before keep taking `v1` (which leaves the key
-- out) until an operator turns it on with `verdict tenant require-signed-keys`, so their
-- senders keep working across the upgrade.
ALTER TABLE tenants ADD COLUMN inbound_signature_covers_key BOOLEAN NOT NULL DEFAULT FALSE;
