-- Tenax schema, version 5: cancelling a running task. A cancel of a running task cannot
-- stop it from the database; it records the request here (database clock), the worker
-- that holds the lease learns it at its next heartbeat and signals the handler, and the
-- handler's outcome is then written as `cancelled`. Additive: a node of the previous
-- version never reads the column and keeps running its tasks to the end. A nullable
-- column without default does not rewrite the table.
ALTER TABLE tenax_tasks ADD COLUMN cancel_requested_at TIMESTAMPTZ;
