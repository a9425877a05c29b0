-- Tenax schema, version 18: long-polls woken by the finish. A request waiting for a
-- task to finish (`GET /v1/tasks/{id}/wait`) records itself in `tenax_waits` before it
-- reads the task; the statement that finishes a waited task sends `NOTIFY
-- tenax_finished` with the task's id, delivered at its commit, and the server's one
-- LISTEN connection wakes that task's waiters. A task nobody waits for sends nothing
-- (NOTIFY serialises commits), and the check is one probe of an index on a table that
-- holds only the requests waiting now. A waiter that crashed leaves a row the next
-- waiter of any task deletes after an hour. Additive: nodes of the previous version
-- never write the table, and their finishes fire the new function.
CREATE TABLE tenax_waits (
    waiter  TEXT        PRIMARY KEY,
    task_id BIGINT      NOT NULL,
    since   TIMESTAMPTZ NOT NULL
);
CREATE INDEX tenax_waits_task ON tenax_waits (task_id);
CREATE INDEX tenax_waits_since ON tenax_waits (since);

CREATE OR REPLACE FUNCTION tenax_outbox_on_finish() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    summary TEXT;
    alerted BOOLEAN;
BEGIN
    IF NEW.status IN ('succeeded', 'dead', 'cancelled') AND NEW.status IS DISTINCT FROM OLD.status THEN
        IF EXISTS (SELECT 1 FROM tenax_waits WHERE task_id = NEW.id) THEN
            PERFORM pg_notify('tenax_finished', NEW.id::text);
        END IF;
        alerted := NEW.status = 'dead'
            AND EXISTS (SELECT 1 FROM tenax_outbox_senders WHERE kind = 'death');
        IF NEW.callback_url IS NULL AND NOT alerted THEN
            RETURN NULL;
        END IF;
        summary := json_build_object(
            'task_id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
            'command_type', NEW.command_type, 'queue', NEW.queue, 'status', NEW.status,
            'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
            'result', NEW.result, 'error', NEW.last_error,
            'finished_at', to_char(COALESCE(NEW.finished_at, NEW.updated_at) AT TIME ZONE 'UTC',
                                   'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))::text;
        IF NEW.callback_url IS NOT NULL THEN
            INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
            VALUES (gen_random_uuid()::text, 'callback', NEW.id, NEW.callback_url, summary,
                    NEW.updated_at, NEW.updated_at);
        END IF;
        IF alerted THEN
            INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
            VALUES (gen_random_uuid()::text, 'death', NEW.id, NULL, summary,
                    NEW.updated_at, NEW.updated_at);
        END IF;
    END IF;
    RETURN NULL;
END
$$;
