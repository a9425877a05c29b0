-- Tenax schema, version 1 (the same numbering on every backend). Times are timestamptz
-- from the database clock. Migrations are additive: a later version adds, a version
-- after that removes, so nodes of the previous version keep running during a deploy.
CREATE TABLE tenax_tasks (
    id               BIGSERIAL PRIMARY KEY,
    task_no          TEXT        NOT NULL,
    kind             TEXT        NOT NULL DEFAULT 'execute' CHECK (kind IN ('execute', 'compensate')),
    parent_id        BIGINT,
    command_type     TEXT        NOT NULL,
    payload          TEXT        NOT NULL,
    queue            TEXT        NOT NULL,
    priority         SMALLINT    NOT NULL CHECK (priority BETWEEN 0 AND 9),
    status           TEXT        NOT NULL CHECK (status IN ('pending', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'blocked')),
    attempt          INTEGER     NOT NULL DEFAULT 0,
    max_attempts     INTEGER     NOT NULL CHECK (max_attempts >= 1),
    lease_epoch      BIGINT      NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    run_at           TIMESTAMPTZ NOT NULL,
    timeout_ms       BIGINT      NOT NULL,
    last_error       TEXT,
    result           TEXT,
    compensation     TEXT CHECK (compensation IN ('pending', 'succeeded', 'failed', 'none')),
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ
);

-- Idempotent enqueue: one task per task_no until it is pruned.
CREATE UNIQUE INDEX tenax_tasks_task_no ON tenax_tasks (task_no);
-- The claim: due tasks of some queues, most urgent first, then oldest run time. Partial,
-- so it holds only waiting tasks and stays small however many finished tasks remain.
CREATE INDEX tenax_tasks_claim ON tenax_tasks (queue, priority DESC, run_at, id)
    WHERE status IN ('pending', 'retrying');
-- The reaper: running tasks by lease expiry.
CREATE INDEX tenax_tasks_lease ON tenax_tasks (lease_expires_at) WHERE status = 'running';
-- The pruner: finished tasks by finish time.
CREATE INDEX tenax_tasks_finished ON tenax_tasks (finished_at)
    WHERE status IN ('succeeded', 'dead', 'cancelled');
CREATE INDEX tenax_tasks_parent ON tenax_tasks (parent_id) WHERE parent_id IS NOT NULL;

-- The bounded attempt history (the last 20 attempts of each task).
CREATE TABLE tenax_attempts (
    task_id     BIGINT      NOT NULL,
    epoch       BIGINT      NOT NULL,
    attempt     INTEGER     NOT NULL,
    worker      TEXT        NOT NULL,
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ,
    outcome     TEXT        NOT NULL,
    error       TEXT,
    PRIMARY KEY (task_id, epoch)
);
