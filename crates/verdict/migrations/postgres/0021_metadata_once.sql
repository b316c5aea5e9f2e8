-- A signal's metadata is stored once: in its callback's envelope, whose bytes are kept fixed
-- for every retry, when the event has a callback of its own; in the event otherwise. This says
-- which (the event's own column then holds an empty string).
ALTER TABLE events ADD COLUMN metadata_in_callback BOOLEAN NOT NULL DEFAULT FALSE;
