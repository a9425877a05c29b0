-- Tenax schema, version 2: the shape version of each task's payload (Command::VERSION of
-- the node that enqueued it). Additive: a node of the previous version never reads or
-- writes the column, and its inserts get the default, 1, the version every command had
-- before versions existed. A worker claims a task only if it knows its payload version.
ALTER TABLE tenax_tasks ADD COLUMN payload_version INTEGER NOT NULL DEFAULT 1
    CHECK (payload_version >= 1);
