-- Tenax schema, version 13: task events. Every state transition of a task that an
-- event rule covers writes one row to tenax_events, from the triggers below, in the
-- same transaction as the transition (an outbox). The sequencer (one node at a time,
-- under the lease row 'sequencer') gives committed events their position `seq`, a
-- gapless number in commit order that streams resume from; relays keep their own
-- position in their lease rows. Additive: a node of the previous version never reads
-- these tables, and its writes fire the triggers like any other. Times are UTC
-- milliseconds, from the database clock.

-- Whether the task's transitions write events, decided once when it is inserted from
-- the rules in force then. The update trigger's WHEN clause reads only this column, so
-- a task without events pays nothing on each transition.
ALTER TABLE tenax_tasks ADD COLUMN events INTEGER NOT NULL DEFAULT 0;

-- Which tasks write events: '' matches any queue or any command type.
CREATE TABLE tenax_event_rules (
    queue        TEXT    NOT NULL,
    command_type TEXT    NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (queue, command_type)
);

CREATE TABLE tenax_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    -- The unique id consumers deduplicate on; the same on every redelivery.
    event_id     TEXT    NOT NULL UNIQUE,
    -- The stream position, NULL until the sequencer reaches the event.
    seq          INTEGER UNIQUE,
    event        TEXT    NOT NULL,
    task_id      INTEGER NOT NULL,
    queue        TEXT    NOT NULL,
    command_type TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    -- The task as the transition left it, JSON text.
    task         TEXT    NOT NULL,
    occurred_at  INTEGER NOT NULL,
    sequenced_at INTEGER
);
CREATE INDEX tenax_events_unsequenced ON tenax_events (id) WHERE seq IS NULL;

-- One row per single-holder role: 'sequencer' (last_seq: the last position given;
-- pruned_through: every position up to it was deleted) and one per relay
-- (last_seq: the last position it delivered).
CREATE TABLE tenax_event_leases (
    name           TEXT    PRIMARY KEY,
    holder         TEXT,
    epoch          INTEGER NOT NULL DEFAULT 0,
    expires_at     INTEGER,
    last_seq       INTEGER NOT NULL DEFAULT 0,
    pruned_through INTEGER NOT NULL DEFAULT 0
);
INSERT INTO tenax_event_leases (name) VALUES ('sequencer');

CREATE TRIGGER tenax_events_on_insert AFTER INSERT ON tenax_tasks
WHEN EXISTS (SELECT 1 FROM tenax_event_rules r
             WHERE r.queue IN ('', NEW.queue) AND r.command_type IN ('', NEW.command_type))
BEGIN
    UPDATE tenax_tasks SET events = 1 WHERE id = NEW.id;
    INSERT INTO tenax_events (event_id, event, task_id, queue, command_type, status, task, occurred_at)
    VALUES (lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-' || hex(randomblob(2))
                  || '-' || hex(randomblob(2)) || '-' || hex(randomblob(6))),
            'enqueued', NEW.id, NEW.queue, NEW.command_type, NEW.status,
            json_object(
                'id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
                'command_type', NEW.command_type, 'queue', NEW.queue, 'priority', NEW.priority,
                'status', NEW.status, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
                'parent_id', NEW.parent_id, 'compensation', NEW.compensation,
                'error', NEW.last_error, 'result', NULL),
            NEW.updated_at);
END;

CREATE TRIGGER tenax_events_on_update AFTER UPDATE OF status, compensation ON tenax_tasks
WHEN NEW.events = 1
     AND (NEW.status IS NOT OLD.status
          OR (NEW.compensation IS NOT OLD.compensation
              AND NEW.compensation IN ('succeeded', 'failed')))
BEGIN
    INSERT INTO tenax_events (event_id, event, task_id, queue, command_type, status, task, occurred_at)
    VALUES (lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-' || hex(randomblob(2))
                  || '-' || hex(randomblob(2)) || '-' || hex(randomblob(6))),
            CASE WHEN NEW.status IS OLD.status THEN 'compensated'
                 WHEN NEW.status = 'running' THEN 'started'
                 WHEN NEW.status = 'retrying' THEN 'retried'
                 WHEN NEW.status IN ('succeeded', 'dead', 'cancelled') THEN NEW.status
                 ELSE 'enqueued' END,
            NEW.id, NEW.queue, NEW.command_type, NEW.status,
            json_object(
                'id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
                'command_type', NEW.command_type, 'queue', NEW.queue, 'priority', NEW.priority,
                'status', NEW.status, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
                'parent_id', NEW.parent_id, 'compensation', NEW.compensation,
                'error', NEW.last_error,
                'result', CASE WHEN NEW.status = 'succeeded' THEN NEW.result END),
            NEW.updated_at);
END;
