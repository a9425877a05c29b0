-- Tenax schema, version 1 (MariaDB 10.11; MySQL 8 syntax). The same tables and columns
-- as the SQLite schema. Times are DATETIME(6) holding UTC (never TIMESTAMP, which the
-- server converts through the session time zone and which ends in 2038), taken from
-- the database clock, UTC_TIMESTAMP(6).
--
-- utf8mb4_bin: names compare byte for byte, as in SQLite, so task numbers that differ
-- only in case are different tasks.
CREATE TABLE tenax_tasks (
    id               BIGINT       NOT NULL AUTO_INCREMENT,
    task_no          VARCHAR(255) NOT NULL,
    kind             VARCHAR(16)  NOT NULL DEFAULT 'execute' CHECK (kind IN ('execute', 'compensate')),
    parent_id        BIGINT       NULL,
    command_type     VARCHAR(255) NOT NULL,
    -- Payloads are at most 1 MiB (checked before the insert); MEDIUMTEXT holds 16 MiB.
    payload          MEDIUMTEXT   NOT NULL,
    queue            VARCHAR(255) NOT NULL,
    priority         TINYINT      NOT NULL CHECK (priority BETWEEN 0 AND 9),
    status           VARCHAR(16)  NOT NULL CHECK (status IN ('pending', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'blocked')),
    attempt          INT          NOT NULL DEFAULT 0,
    max_attempts     INT          NOT NULL CHECK (max_attempts >= 1),
    lease_epoch      BIGINT       NOT NULL DEFAULT 0,
    lease_owner      TEXT         NULL,
    lease_expires_at DATETIME(6)  NULL,
    run_at           DATETIME(6)  NOT NULL,
    timeout_ms       BIGINT       NOT NULL,
    last_error       TEXT         NULL,
    result           LONGTEXT     NULL,
    compensation     VARCHAR(16)  NULL CHECK (compensation IN ('pending', 'succeeded', 'failed', 'none')),
    created_at       DATETIME(6)  NOT NULL,
    updated_at       DATETIME(6)  NOT NULL,
    started_at       DATETIME(6)  NULL,
    finished_at      DATETIME(6)  NULL,
    PRIMARY KEY (id),
    -- Idempotent enqueue: one task per task_no until it is pruned.
    UNIQUE KEY tenax_tasks_task_no (task_no),
    -- The claim: due tasks of some queues, most urgent first, then oldest run time.
    -- There are no partial indexes, so status leads: the waiting statuses are a narrow
    -- range however many finished tasks the table keeps. The claim reads one
    -- (status, queue) at a time, and priority DESC lets it walk this index in its
    -- ORDER BY (priority DESC, run_at, id) and stop after LIMIT rows, with no sort
    -- (descending index parts: MariaDB 10.8+, MySQL 8).
    KEY tenax_tasks_claim (status, queue, priority DESC, run_at, id),
    -- The reaper: running tasks by lease expiry.
    KEY tenax_tasks_lease (status, lease_expires_at),
    -- The pruner: finished tasks by finish time.
    KEY tenax_tasks_finished (status, finished_at),
    KEY tenax_tasks_parent (parent_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The bounded attempt history (the last 20 attempts of each task).
CREATE TABLE tenax_attempts (
    task_id     BIGINT      NOT NULL,
    epoch       BIGINT      NOT NULL,
    attempt     INT         NOT NULL,
    worker      TEXT        NOT NULL,
    started_at  DATETIME(6) NOT NULL,
    finished_at DATETIME(6) NULL,
    outcome     VARCHAR(16) NOT NULL,
    error       TEXT        NULL,
    PRIMARY KEY (task_id, epoch)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
