-- A case's opening event is its `opened_by_event`; a `case_events` row for it too was a second
-- row written for every case opened, most signals that open one. `case_events` now holds the
-- events attached to a case after it was opened, and a case's events are its opener and those.
DELETE FROM case_events
WHERE EXISTS (SELECT 1 FROM cases c
    WHERE c.id = case_events.case_id AND c.opened_by_event = case_events.event_id);
