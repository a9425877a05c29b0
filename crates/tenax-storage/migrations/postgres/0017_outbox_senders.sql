-- Tenax schema, version 17: the senders of the outbox. Each sender records the kinds it
-- sends here while it runs (`seen_at`, database clock, refreshed every minute), before
-- its worker claims anything. A death writes its `death` row only while a `death`
-- sender is recorded, so a deployment without alerts stores none. The pruner forgets a
-- sender silent for a day (a delivery's default maximum age), and expires the pending
-- rows, older than that, of kinds no recorded sender takes; the outbox gauges count
-- only kinds some sender takes. Kinds delivered before in this database are recorded
-- as seen now, so a rolling upgrade keeps writing death rows while the nodes of the
-- previous version (which record nothing) still send them: finish it within a day. Additive: a node
-- of the previous version never reads the table.
CREATE TABLE tenax_outbox_senders (
    kind    TEXT        PRIMARY KEY CHECK (kind IN ('callback', 'death', 'alert')),
    seen_at TIMESTAMPTZ NOT NULL
);
INSERT INTO tenax_outbox_senders (kind, seen_at)
SELECT DISTINCT kind, now() FROM tenax_outbox WHERE status = 'delivered';

CREATE OR REPLACE FUNCTION tenax_outbox_on_finish() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    summary TEXT;
    alerted BOOLEAN;
BEGIN
    IF NEW.status IN ('succeeded', 'dead', 'cancelled') AND NEW.status IS DISTINCT FROM OLD.status THEN
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
