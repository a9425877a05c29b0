-- Tenax schema, version 4: periodic schedules (cron expressions and intervals). Additive:
-- a node of a previous version never reads the table, and its workers run the tasks
-- the schedules enqueue like any other.
--
-- Each tick enqueues one task numbered 'sched:<name>:<tick>', so the unique index on
-- tenax_tasks.task_no decides that a tick fires once; next_fire_at is advanced in the
-- same transaction, under the row lock and a write conditional on the value read.
CREATE TABLE tenax_schedules (
    name            TEXT        PRIMARY KEY,
    kind            TEXT        NOT NULL CHECK (kind IN ('cron', 'interval')),
    cron            TEXT,
    timezone        TEXT,
    interval_s      BIGINT      CHECK (interval_s >= 1),
    command_type    TEXT        NOT NULL,
    payload         TEXT        NOT NULL,
    payload_version INTEGER     NOT NULL CHECK (payload_version >= 1),
    queue           TEXT        NOT NULL,
    priority        SMALLINT    NOT NULL CHECK (priority BETWEEN 0 AND 9),
    max_attempts    INTEGER     NOT NULL CHECK (max_attempts >= 1),
    timeout_ms      BIGINT      NOT NULL,
    missed          TEXT        NOT NULL CHECK (missed IN ('skip', 'catch_up')),
    catch_up        INTEGER     NOT NULL DEFAULT 0,
    paused          BOOLEAN     NOT NULL DEFAULT FALSE,
    next_fire_at    TIMESTAMPTZ,
    last_tick       TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);
-- The scheduler: schedules that are due, soonest first.
CREATE INDEX tenax_schedules_due ON tenax_schedules (next_fire_at) WHERE NOT paused;
