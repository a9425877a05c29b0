-- Tenax schema, version 13: task events. Every state transition of a task that an
-- event rule covers writes one row to tenax_events, from the triggers below, in the
-- same transaction as the transition (an outbox). The sequencer (one node at a time,
-- under the lease row 'sequencer') gives committed events their position `seq`, a
-- gapless number in commit order that streams resume from; relays keep their own
-- position in their lease rows. Additive: a node of the previous version never reads
-- these tables, and its writes fire the triggers like any other. Times are
-- DATETIME(6) holding UTC.
--
-- With binary logging on, creating a trigger needs the SUPER privilege or
-- log_bin_trust_function_creators = 1 (see Storage::migrate).

-- Whether the task's transitions write events, decided once when it is inserted from
-- the rules in force then; the update trigger's condition tests this column first.
ALTER TABLE tenax_tasks ADD COLUMN events TINYINT NOT NULL DEFAULT 0;

-- Which tasks write events: '' matches any queue or any command type.
CREATE TABLE tenax_event_rules (
    queue        VARCHAR(255) NOT NULL,
    command_type VARCHAR(255) NOT NULL,
    created_at   DATETIME(6)  NOT NULL,
    PRIMARY KEY (queue, command_type)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE tenax_events (
    id           BIGINT       NOT NULL AUTO_INCREMENT,
    -- The unique id consumers deduplicate on; the same on every redelivery.
    event_id     VARCHAR(64)  NOT NULL,
    -- The stream position, NULL until the sequencer reaches the event.
    seq          BIGINT       NULL,
    event        VARCHAR(16)  NOT NULL,
    task_id      BIGINT       NOT NULL,
    queue        VARCHAR(255) NOT NULL,
    command_type VARCHAR(255) NOT NULL,
    status       VARCHAR(16)  NOT NULL,
    -- The task as the transition left it, JSON text.
    task         LONGTEXT     NOT NULL,
    occurred_at  DATETIME(6)  NOT NULL,
    sequenced_at DATETIME(6)  NULL,
    PRIMARY KEY (id),
    UNIQUE KEY tenax_events_event_id (event_id),
    UNIQUE KEY tenax_events_seq (seq),
    KEY tenax_events_unsequenced (seq, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per single-holder role: 'sequencer' (last_seq: the last position given;
-- pruned_through: every position up to it was deleted) and one per relay
-- (last_seq: the last position it delivered).
CREATE TABLE tenax_event_leases (
    name           VARCHAR(64)  NOT NULL,
    holder         VARCHAR(255) NULL,
    epoch          BIGINT       NOT NULL DEFAULT 0,
    expires_at     DATETIME(6)  NULL,
    last_seq       BIGINT       NOT NULL DEFAULT 0,
    pruned_through BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT INTO tenax_event_leases (name) VALUES ('sequencer');

CREATE TRIGGER tenax_events_flag BEFORE INSERT ON tenax_tasks FOR EACH ROW
    SET NEW.events = EXISTS (SELECT 1 FROM tenax_event_rules r
                             WHERE r.queue IN ('', NEW.queue)
                               AND r.command_type IN ('', NEW.command_type));

CREATE TRIGGER tenax_events_on_insert AFTER INSERT ON tenax_tasks FOR EACH ROW
    INSERT INTO tenax_events (event_id, event, task_id, queue, command_type, status, task, occurred_at)
    SELECT UUID(), 'enqueued', NEW.id, NEW.queue, NEW.command_type, NEW.status,
           JSON_OBJECT(
               'id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
               'command_type', NEW.command_type, 'queue', NEW.queue, 'priority', NEW.priority,
               'status', NEW.status, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
               'parent_id', NEW.parent_id, 'compensation', NEW.compensation,
               'error', NEW.last_error, 'result', NULL),
           NEW.updated_at
    FROM DUAL WHERE NEW.events = 1;

CREATE TRIGGER tenax_events_on_update AFTER UPDATE ON tenax_tasks FOR EACH ROW
    INSERT INTO tenax_events (event_id, event, task_id, queue, command_type, status, task, occurred_at)
    SELECT UUID(),
           CASE WHEN NEW.status <=> OLD.status THEN 'compensated'
                WHEN NEW.status = 'running' THEN 'started'
                WHEN NEW.status = 'retrying' THEN 'retried'
                WHEN NEW.status IN ('succeeded', 'dead', 'cancelled') THEN NEW.status
                ELSE 'enqueued' END,
           NEW.id, NEW.queue, NEW.command_type, NEW.status,
           JSON_OBJECT(
               'id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
               'command_type', NEW.command_type, 'queue', NEW.queue, 'priority', NEW.priority,
               'status', NEW.status, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
               'parent_id', NEW.parent_id, 'compensation', NEW.compensation,
               'error', NEW.last_error,
               'result', IF(NEW.status = 'succeeded', NEW.result, NULL)),
           NEW.updated_at
    FROM DUAL
    WHERE NEW.events = 1
      AND (NOT (NEW.status <=> OLD.status)
           OR (NOT (NEW.compensation <=> OLD.compensation)
               AND NEW.compensation IN ('succeeded', 'failed')));
