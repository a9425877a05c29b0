-- Tenax schema, version 12: queue threshold alerts go through the outbox like every
-- other outbound delivery. A recorded change of a threshold alert writes an `alert`
-- row in the same transaction, so the message survives a restart and is retried until
-- the webhook acknowledges it. Such a row names no task (task_id 0). Additive: nodes
-- of version 11 never claim `alert` rows.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt with the
-- wider one, and the trigger of version 10 (which names the table) is dropped first
-- and created again, unchanged, after the rename.
DROP TRIGGER tenax_outbox_on_finish;

CREATE TABLE tenax_outbox_v12 (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    -- Stable across redeliveries: receivers deduplicate on it.
    delivery_id     TEXT    NOT NULL UNIQUE,
    kind            TEXT    NOT NULL CHECK (kind IN ('callback', 'death', 'alert')),
    -- The task the row is about; 0 for a queue alert.
    task_id         INTEGER NOT NULL,
    -- Where a callback goes; NULL for alerts (they go to the configured webhook).
    url             TEXT,
    -- The task summary (or the alert message) as JSON text, fixed when written.
    body            TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'expired')),
    -- Claims so far; a settle names the claim it ends.
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    settled_at      INTEGER
);
INSERT INTO tenax_outbox_v12 (id, delivery_id, kind, task_id, url, body, status, attempts,
                              next_attempt_at, last_error, created_at, settled_at)
SELECT id, delivery_id, kind, task_id, url, body, status, attempts,
       next_attempt_at, last_error, created_at, settled_at
FROM tenax_outbox;
DROP TABLE tenax_outbox;
ALTER TABLE tenax_outbox_v12 RENAME TO tenax_outbox;
CREATE INDEX tenax_outbox_due ON tenax_outbox (kind, next_attempt_at, id) WHERE status = 'pending';
CREATE INDEX tenax_outbox_settled ON tenax_outbox (settled_at) WHERE status <> 'pending';
CREATE INDEX tenax_outbox_task ON tenax_outbox (task_id);

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
       OR (k.kind = 'death' AND NEW.status = 'dead');
END;
