-- Keys made for one feed alone: a carrier's CAMARA sink credential or a SET transmitter's key
-- may post to its feed and nothing else. NULL: every endpoint the scope allows. A tenant that
-- requires signed signals takes only such keys on its feeds, which cannot carry our signature.
ALTER TABLE api_keys ADD COLUMN feed TEXT CHECK (feed IN ('camara', 'set'));
