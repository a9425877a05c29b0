-- Tenax schema, version 16: who enqueued each task through the HTTP API, the name of
-- the token it presented. An enqueue token reads back only the tasks enqueued under
-- its own name. NULL for a task enqueued by the library, the CLI, a schedule, a
-- compensation, or a server without tokens: no enqueue token reads those. Additive: a
-- node of the previous version never reads or writes the column, and its inserts
-- leave it NULL. A nullable column without a default does not rewrite the table.
ALTER TABLE tenax_tasks ADD COLUMN created_by TEXT;
