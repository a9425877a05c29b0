-- Tenax schema, version 3: claim controls. Additive: nodes of the previous version keep
-- running (they still claim by priority, then run time, through tenax_tasks_claim; a
-- later version drops that index). They name their columns, so the new ones are
-- invisible to them.
--
-- Priorities age: the claim orders due tasks by claim_key = run_at - priority * 60 s
-- (tenax_core::PRIORITY_AGING_STEP), then id, so a priority-0 task is overtaken only by
-- tasks due less than 9 minutes after it. A generated (VIRTUAL, indexed) column rather
-- than one the code maintains: the server computes it on every write that sets run_at
-- or priority, including the writes of nodes of the previous version, and MariaDB has
-- no expression indexes. As with tenax_tasks_claim, status leads (no partial indexes).
ALTER TABLE tenax_tasks
    ADD COLUMN claim_key DATETIME(6) GENERATED ALWAYS AS (run_at - INTERVAL (priority * 60) SECOND) VIRTUAL,
    ADD KEY tenax_tasks_claim_key (status, queue, claim_key, id);

-- Queue controls. A queue needs no row: a queue without one is unpaused and unlimited,
-- and the claim takes its fast path. Nodes of the previous version do not read this
-- table: finish the deploy before relying on pause and limits.
CREATE TABLE tenax_queues (
    name        VARCHAR(255) NOT NULL,
    paused      BOOLEAN      NOT NULL DEFAULT FALSE,
    max_running INT          NULL CHECK (max_running IS NULL OR max_running >= 1),
    updated_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
