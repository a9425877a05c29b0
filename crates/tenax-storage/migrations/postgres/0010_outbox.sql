-- Tenax schema, version 10: the outbox of outbound deliveries (completion callbacks and
-- death alerts). A row is written by the trigger below in the same transaction as the
-- status change that causes it, so every path that finishes a task (completion,
-- failure, the reaper, cancels one by one, in bulk or through a workflow) is covered.
-- Additive: a node of the previous version never reads the table, and its updates fire
-- the trigger like any other.
ALTER TABLE tenax_tasks ADD COLUMN callback_url TEXT;

CREATE TABLE tenax_outbox (
    id              BIGSERIAL   PRIMARY KEY,
    -- Stable across redeliveries: receivers deduplicate on it.
    delivery_id     TEXT        NOT NULL UNIQUE,
    kind            TEXT        NOT NULL CHECK (kind IN ('callback', 'death')),
    task_id         BIGINT      NOT NULL,
    -- Where a callback goes; NULL for a death (alerts go to the configured webhook).
    url             TEXT,
    -- The task summary as JSON text, fixed when the row is written.
    body            TEXT        NOT NULL,
    status          TEXT        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'expired')),
    -- Claims so far; a settle names the claim it ends.
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    settled_at      TIMESTAMPTZ
);
CREATE INDEX tenax_outbox_due ON tenax_outbox (kind, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX tenax_outbox_settled ON tenax_outbox (settled_at) WHERE status <> 'pending';
CREATE INDEX tenax_outbox_task ON tenax_outbox (task_id);

CREATE FUNCTION tenax_outbox_on_finish() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    summary TEXT;
BEGIN
    IF NEW.status IN ('succeeded', 'dead', 'cancelled') AND NEW.status IS DISTINCT FROM OLD.status
       AND (NEW.callback_url IS NOT NULL OR NEW.status = 'dead') THEN
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
        IF NEW.status = 'dead' THEN
            INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
            VALUES (gen_random_uuid()::text, 'death', NEW.id, NULL, summary,
                    NEW.updated_at, NEW.updated_at);
        END IF;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER tenax_outbox_on_finish AFTER UPDATE OF status ON tenax_tasks
    FOR EACH ROW EXECUTE FUNCTION tenax_outbox_on_finish();
