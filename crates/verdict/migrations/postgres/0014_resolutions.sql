-- An operator's resolution of an action request whose outcome is `unknown` (to `succeeded` or
-- `failed`), recorded as an attempt of its own kind, `resolve`, with the API key that resolved it
-- (the nil key for the CLI) and why. No call is made: nothing is sent, nothing answers.
ALTER TABLE delivery_attempts DROP CONSTRAINT delivery_attempts_trigger_kind_check;
ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_trigger_kind_check
    CHECK (trigger_kind IN ('inline', 'worker', 'redeliver', 'resolve'));
ALTER TABLE delivery_attempts ADD COLUMN resolved_by UUID;
ALTER TABLE delivery_attempts ADD COLUMN reason TEXT;
