-- Tenax schema, version 14: an insert may decide the `events` flag itself. The row
-- trigger of version 13 runs a PL/pgSQL function and a query per inserted row, which
-- was about a third of a bulk insert's server time. Tenax's own insert now writes the
-- flag from the same rule test in its statement, and the trigger fires only for a row
-- whose insert left the flag unset (NULL: the column no longer has a default, and NOT
-- NULL is checked after BEFORE triggers), so every other insert, including one by a
-- node of the previous version, is still flagged by the rules in force.
ALTER TABLE tenax_tasks ALTER COLUMN events DROP DEFAULT;
DROP TRIGGER tenax_events_flag ON tenax_tasks;
CREATE TRIGGER tenax_events_flag BEFORE INSERT ON tenax_tasks
    FOR EACH ROW WHEN (NEW.events IS NULL) EXECUTE FUNCTION tenax_events_flag();
