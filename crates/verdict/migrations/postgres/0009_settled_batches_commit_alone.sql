-- A group commit whose every signal settles in its one statement runs that statement on its
-- own, committed as it ends (one round trip instead of BEGIN, the statement, COMMIT). When a
-- signal in it cannot settle there (a duplicate in the batch, an effect another event already
-- holds), the statement calls this to abort: nothing of it is kept, and the batch runs again
-- in a transaction that finishes those signals with their actual outcomes.
CREATE FUNCTION verdict_require_settled(unsettled bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF unsettled > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'VD001',
            MESSAGE = format('%s signals of the batch need their actual outcomes', unsettled);
    END IF;
    RETURN TRUE;
END
$$;
