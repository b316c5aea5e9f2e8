-- Pruning deleted each settled delivery through the foreign key's trigger, which looked up
-- `delivery_attempts` again for every row: 3.5 of the 9 ms a batch of 500 events took on a
-- grown database (docs/benchmarks.md, fifteenth session). The key guarded one thing, that no
-- attempt outlives its delivery, and the pruner now keeps that itself: it deletes a delivery
-- first, waiting out any writer that holds it, and then, in a statement of its own that sees
-- what that writer committed, the delivery's attempts. Nothing else deletes deliveries, and an
-- attempt is only written beside an update of its delivery (the worker's, a redelivery's, a
-- resolution's), which finds no row once the pruner has taken it.
ALTER TABLE delivery_attempts DROP CONSTRAINT delivery_attempts_delivery_id_fkey;
