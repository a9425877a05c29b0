-- Tenax schema, version 13: task events. Every state transition of a task that an
-- event rule covers writes one row to tenax_events, from the triggers below, in the
-- same transaction as the transition (an outbox). The sequencer (one node at a time,
-- under the lease row 'sequencer') gives committed events their position `seq`, a
-- gapless number in commit order that streams resume from; relays keep their own
-- position in their lease rows. Additive: a node of the previous version never reads
-- these tables, and its writes fire the triggers like any other.

-- Whether the task's transitions write events, decided once when it is inserted from
-- the rules in force then. The update trigger's WHEN clause reads only this column, so
-- a task without events pays nothing on each transition.
ALTER TABLE tenax_tasks ADD COLUMN events BOOLEAN NOT NULL DEFAULT FALSE;

-- Which tasks write events: '' matches any queue or any command type.
CREATE TABLE tenax_event_rules (
    queue        TEXT        NOT NULL,
    command_type TEXT        NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, command_type)
);

CREATE TABLE tenax_events (
    id           BIGSERIAL   PRIMARY KEY,
    -- The unique id consumers deduplicate on; the same on every redelivery.
    event_id     TEXT        NOT NULL UNIQUE,
    -- The stream position, NULL until the sequencer reaches the event.
    seq          BIGINT      UNIQUE,
    event        TEXT        NOT NULL,
    task_id      BIGINT      NOT NULL,
    queue        TEXT        NOT NULL,
    command_type TEXT        NOT NULL,
    status       TEXT        NOT NULL,
    -- The task as the transition left it, JSON text.
    task         TEXT        NOT NULL,
    occurred_at  TIMESTAMPTZ NOT NULL,
    sequenced_at TIMESTAMPTZ
);
CREATE INDEX tenax_events_unsequenced ON tenax_events (id) WHERE seq IS NULL;

-- One row per single-holder role: 'sequencer' (last_seq: the last position given;
-- pruned_through: every position up to it was deleted) and one per relay
-- (last_seq: the last position it delivered).
CREATE TABLE tenax_event_leases (
    name           TEXT        PRIMARY KEY,
    holder         TEXT,
    epoch          BIGINT      NOT NULL DEFAULT 0,
    expires_at     TIMESTAMPTZ,
    last_seq       BIGINT      NOT NULL DEFAULT 0,
    pruned_through BIGINT      NOT NULL DEFAULT 0
);
INSERT INTO tenax_event_leases (name) VALUES ('sequencer');

CREATE FUNCTION tenax_events_flag() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.events := EXISTS (SELECT 1 FROM tenax_event_rules r
                          WHERE r.queue IN ('', NEW.queue)
                            AND r.command_type IN ('', NEW.command_type));
    RETURN NEW;
END
$$;

CREATE FUNCTION tenax_events_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ev TEXT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        ev := 'enqueued';
    ELSIF NEW.status IS DISTINCT FROM OLD.status THEN
        ev := CASE NEW.status
                  WHEN 'running' THEN 'started'
                  WHEN 'retrying' THEN 'retried'
                  WHEN 'succeeded' THEN 'succeeded'
                  WHEN 'dead' THEN 'dead'
                  WHEN 'cancelled' THEN 'cancelled'
                  ELSE 'enqueued'
              END;
    ELSIF NEW.compensation IS DISTINCT FROM OLD.compensation
          AND NEW.compensation IN ('succeeded', 'failed') THEN
        ev := 'compensated';
    ELSE
        RETURN NULL;
    END IF;
    INSERT INTO tenax_events (event_id, event, task_id, queue, command_type, status, task, occurred_at)
    VALUES (gen_random_uuid()::text, ev, NEW.id, NEW.queue, NEW.command_type, NEW.status,
            json_build_object(
                'id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
                'command_type', NEW.command_type, 'queue', NEW.queue, 'priority', NEW.priority,
                'status', NEW.status, 'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
                'parent_id', NEW.parent_id, 'compensation', NEW.compensation,
                'error', NEW.last_error,
                'result', CASE WHEN NEW.status = 'succeeded' THEN NEW.result END)::text,
            NEW.updated_at);
    RETURN NULL;
END
$$;

CREATE TRIGGER tenax_events_flag BEFORE INSERT ON tenax_tasks
    FOR EACH ROW EXECUTE FUNCTION tenax_events_flag();
CREATE TRIGGER tenax_events_on_insert AFTER INSERT ON tenax_tasks
    FOR EACH ROW WHEN (NEW.events) EXECUTE FUNCTION tenax_events_write();
CREATE TRIGGER tenax_events_on_update AFTER UPDATE OF status, compensation ON tenax_tasks
    FOR EACH ROW WHEN (NEW.events) EXECUTE FUNCTION tenax_events_write();
