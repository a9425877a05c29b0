-- Tenax schema, version 2: the shape version of each task's payload (Command::VERSION of
-- the node that enqueued it). Additive: a node of the previous version never reads or
-- writes the column, and its inserts get the default, 1, the version every command had
-- before versions existed. A worker claims a task only if it knows its payload version.
--
-- A constant default does not rewrite the table. The check is added NOT VALID so that
-- it holds for every new or changed row without a scan of the existing ones under the
-- table lock (they all hold the default).
ALTER TABLE tenax_tasks ADD COLUMN payload_version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE tenax_tasks ADD CONSTRAINT tenax_tasks_payload_version_check
    CHECK (payload_version >= 1) NOT VALID;
