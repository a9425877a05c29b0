-- Tenax schema, version 4: periodic schedules (cron expressions and intervals). Additive:
-- a node of a previous version never reads the table, and its workers run the tasks
-- the schedules enqueue like any other. Times are DATETIME(6) holding UTC.
--
-- Each tick enqueues one task numbered 'sched:<name>:<tick>', so the unique key on
-- tenax_tasks.task_no decides that a tick fires once; next_fire_at is advanced in the
-- same transaction, under the row lock and a write conditional on the value read.
CREATE TABLE tenax_schedules (
    name            VARCHAR(100) NOT NULL,
    kind            VARCHAR(16)  NOT NULL CHECK (kind IN ('cron', 'interval')),
    cron            VARCHAR(255) NULL,
    timezone        VARCHAR(64)  NULL,
    interval_s      BIGINT       NULL CHECK (interval_s >= 1),
    command_type    VARCHAR(255) NOT NULL,
    payload         MEDIUMTEXT   NOT NULL,
    payload_version INT          NOT NULL CHECK (payload_version >= 1),
    queue           VARCHAR(255) NOT NULL,
    priority        TINYINT      NOT NULL CHECK (priority BETWEEN 0 AND 9),
    max_attempts    INT          NOT NULL CHECK (max_attempts >= 1),
    timeout_ms      BIGINT       NOT NULL,
    missed          VARCHAR(16)  NOT NULL CHECK (missed IN ('skip', 'catch_up')),
    catch_up        INT          NOT NULL DEFAULT 0,
    paused          BOOLEAN      NOT NULL DEFAULT FALSE,
    next_fire_at    DATETIME(6)  NULL,
    last_tick       DATETIME(6)  NULL,
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL,
    PRIMARY KEY (name),
    -- The scheduler: schedules that are due, soonest first (paused leads: no partial
    -- indexes here).
    KEY tenax_schedules_due (paused, next_fire_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
