-- The sent mark of an at-most-once connector's request: set (unix ms), durably, before the first
-- byte of a call leaves, and cleared by the statement that records the call's attempt. A request
-- found marked with no attempt recorded since may have acted in a call whose outcome a crash
-- lost: it is never called again, and its outcome is `unknown`, for an operator.
ALTER TABLE deliveries ADD COLUMN sent_at INTEGER;
