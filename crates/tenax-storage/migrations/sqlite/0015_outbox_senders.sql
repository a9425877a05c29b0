-- Tenax schema, version 15: the senders of the outbox. Each sender records the kinds it
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
    kind    TEXT    NOT NULL PRIMARY KEY CHECK (kind IN ('callback', 'death', 'alert')),
    seen_at INTEGER NOT NULL
);
INSERT INTO tenax_outbox_senders (kind, seen_at)
SELECT DISTINCT kind, CAST(unixepoch('subsec') * 1000 AS INTEGER)
FROM tenax_outbox WHERE status = 'delivered';

DROP TRIGGER tenax_outbox_on_finish;

CREATE TRIGGER tenax_outbox_on_finish AFTER UPDATE OF status ON tenax_tasks
WHEN NEW.status IN ('succeeded', 'dead', 'cancelled') AND NEW.status IS NOT OLD.status
BEGIN
    INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
    SELECT lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-' || hex(randomblob(2))
                 || '-' || hex(randomblob(2)) || '-' || hex(randomblob(6))),
           k.kind, NEW.id, CASE WHEN k.kind = 'callback' THEN NEW.callback_url END,
           json_object(
               'task_id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
               'command_type', NEW.command_type, 'queue', NEW.queue, 'status', NEW.status,
               'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
               'result', NEW.result, 'error', NEW.last_error,
               'finished_at', strftime('%Y-%m-%dT%H:%M:%fZ',
                                       COALESCE(NEW.finished_at, NEW.updated_at) / 1000.0,
                                       'unixepoch')),
           NEW.updated_at, NEW.updated_at
    FROM (SELECT 'callback' AS kind UNION ALL SELECT 'death') AS k
    WHERE (k.kind = 'callback' AND NEW.callback_url IS NOT NULL)
       OR (k.kind = 'death' AND NEW.status = 'dead'
           AND EXISTS (SELECT 1 FROM tenax_outbox_senders AS s WHERE s.kind = 'death'));
END;
