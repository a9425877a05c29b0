-- Tenax schema, version 3: claim controls. Additive: nodes of the previous version keep
-- running (they still claim by priority, then run time, through tenax_tasks_claim; a
-- later version drops that index).
--
-- Priorities age: the claim orders due tasks by the key run_at - priority * 60 000 ms
-- (tenax_core::PRIORITY_AGING_STEP), then id, so a priority-0 task is overtaken only by
-- tasks due less than 9 minutes after it. An expression index rather than a stored
-- column: SQLite computes it on every write that sets run_at or priority, including the
-- writes of nodes of the previous version, which know nothing of the key, and the claim
-- names the same expression so the planner walks this index in order.
CREATE INDEX tenax_tasks_claim_key ON tenax_tasks (queue, run_at - priority * 60000, id)
    WHERE status IN ('pending', 'retrying');

-- Queue controls. A queue needs no row: a queue without one is unpaused and unlimited,
-- and the claim takes its fast path. Nodes of the previous version do not read this
-- table: finish the deploy before relying on pause and limits.
CREATE TABLE tenax_queues (
    name        TEXT    PRIMARY KEY,
    paused      INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    max_running INTEGER CHECK (max_running IS NULL OR max_running >= 1),
    updated_at  INTEGER NOT NULL
);
