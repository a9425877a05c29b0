-- Tenax schema, version 9: workflows (task dependencies and sagas). Additive: nodes of
-- earlier versions keep running; they never claim a blocked task, but they would not
-- unblock dependents or compensate a saga: finish the deploy before enqueueing workflows.
--
-- A workflow is a group of tasks enqueued together; a task with parents waits `blocked`
-- with waiting_parents = its number of unfinished parents. The transaction that
-- finishes a parent decrements its children's counters and moves those reaching zero to
-- `pending` (or cancels the dependents when the parent did not succeed).
CREATE TABLE tenax_workflows (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT    NOT NULL CHECK (length(CAST(name AS BLOB)) BETWEEN 1 AND 100),
    kind         TEXT    NOT NULL CHECK (kind IN ('dag', 'saga')),
    policy       TEXT    NOT NULL CHECK (policy IN ('cancel_dependents', 'run_anyway')),
    -- A DAG's stored state stays 'running' (its status is read from its tasks); a
    -- saga's is written by the transaction that decides it.
    state        TEXT    NOT NULL CHECK (state IN ('running', 'compensating', 'completed',
                                                   'compensated', 'compensation_failed')),
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    finished_at  INTEGER
);

ALTER TABLE tenax_tasks ADD COLUMN workflow_id INTEGER;
ALTER TABLE tenax_tasks ADD COLUMN workflow_key TEXT;
ALTER TABLE tenax_tasks ADD COLUMN waiting_parents INTEGER NOT NULL DEFAULT 0;

-- Blocked tasks, for the count-down: the children of a finished parent are found
-- through tenax_task_deps and matched here, without reading the rest of the table.
CREATE INDEX tenax_tasks_blocked ON tenax_tasks (id) WHERE status = 'blocked';

CREATE INDEX tenax_tasks_workflow ON tenax_tasks (workflow_id, status)
    WHERE workflow_id IS NOT NULL;

-- One row per dependency: child waits for parent. Looked up by parent when the parent
-- finishes (the primary key), by child when a task reads its parents' results.
CREATE TABLE tenax_task_deps (
    parent_id INTEGER NOT NULL,
    child_id  INTEGER NOT NULL,
    PRIMARY KEY (parent_id, child_id)
) WITHOUT ROWID;
CREATE INDEX tenax_task_deps_child ON tenax_task_deps (child_id, parent_id);
