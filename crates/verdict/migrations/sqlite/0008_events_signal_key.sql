-- Each event's signal key (the keyed digest of subject, type and observation time, as the
-- deliveries and ledger entries already hold it): events of one signal, sent under several
-- keys or none, share it. Events stored before it read as empty.
ALTER TABLE events ADD COLUMN signal_key BLOB NOT NULL DEFAULT x'';
