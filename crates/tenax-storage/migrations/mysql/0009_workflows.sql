-- Tenax schema, version 9: workflows (task dependencies and sagas). Additive: nodes of
-- earlier versions keep running; they never claim a blocked task, but they would not
-- unblock dependents or compensate a saga: finish the deploy before enqueueing workflows.
--
-- A workflow is a group of tasks enqueued together; a task with parents waits `blocked`
-- with waiting_parents = its number of unfinished parents. The transaction that
-- finishes a parent decrements its children's counters and moves those reaching zero to
-- `pending` (or cancels the dependents when the parent did not succeed).
CREATE TABLE tenax_workflows (
    id           BIGINT       NOT NULL AUTO_INCREMENT,
    name         VARCHAR(100) NOT NULL,
    kind         VARCHAR(8)   NOT NULL CHECK (kind IN ('dag', 'saga')),
    policy       VARCHAR(24)  NOT NULL CHECK (policy IN ('cancel_dependents', 'run_anyway')),
    -- A DAG's stored state stays 'running' (its status is read from its tasks); a
    -- saga's is written by the transaction that decides it.
    state        VARCHAR(24)  NOT NULL CHECK (state IN ('running', 'compensating', 'completed',
                                                        'compensated', 'compensation_failed')),
    created_at   DATETIME(6)  NOT NULL,
    updated_at   DATETIME(6)  NOT NULL,
    finished_at  DATETIME(6)  NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE tenax_tasks
    ADD COLUMN workflow_id BIGINT NULL,
    ADD COLUMN workflow_key VARCHAR(100) NULL,
    ADD COLUMN waiting_parents INT NOT NULL DEFAULT 0,
    ADD KEY tenax_tasks_workflow (workflow_id, status);

-- One row per dependency: child waits for parent. Looked up by parent when the parent
-- finishes (the primary key), by child when a task reads its parents' results.
CREATE TABLE tenax_task_deps (
    parent_id BIGINT NOT NULL,
    child_id  BIGINT NOT NULL,
    PRIMARY KEY (parent_id, child_id),
    KEY tenax_task_deps_child (child_id, parent_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
