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
    kind    VARCHAR(16) NOT NULL CHECK (kind IN ('callback', 'death', 'alert')),
    seen_at DATETIME(6) NOT NULL,
    PRIMARY KEY (kind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT INTO tenax_outbox_senders (kind, seen_at)
SELECT DISTINCT kind, UTC_TIMESTAMP(6) FROM tenax_outbox WHERE status = 'delivered';

-- Replaced in one statement (MariaDB's CREATE OR REPLACE): a DROP then a CREATE would
-- each commit, and a finish between them would write no row.
CREATE OR REPLACE TRIGGER tenax_outbox_on_finish AFTER UPDATE ON tenax_tasks FOR EACH ROW
    INSERT INTO tenax_outbox (delivery_id, kind, task_id, url, body, next_attempt_at, created_at)
    SELECT UUID(), k.kind, NEW.id, IF(k.kind = 'callback', NEW.callback_url, NULL),
           JSON_OBJECT(
               'task_id', NEW.id, 'task_no', NEW.task_no, 'kind', NEW.kind,
               'command_type', NEW.command_type, 'queue', NEW.queue, 'status', NEW.status,
               'attempt', NEW.attempt, 'max_attempts', NEW.max_attempts,
               'result', NEW.result, 'error', NEW.last_error,
               'finished_at', DATE_FORMAT(COALESCE(NEW.finished_at, NEW.updated_at),
                                          '%Y-%m-%dT%H:%i:%s.%fZ')),
           NEW.updated_at, NEW.updated_at
    FROM (SELECT 'callback' AS kind UNION ALL SELECT 'death') AS k
    WHERE NEW.status IN ('succeeded', 'dead', 'cancelled') AND NOT (NEW.status <=> OLD.status)
      AND ((k.kind = 'callback' AND NEW.callback_url IS NOT NULL)
           OR (k.kind = 'death' AND NEW.status = 'dead'
               AND EXISTS (SELECT 1 FROM tenax_outbox_senders AS s WHERE s.kind = 'death')));
