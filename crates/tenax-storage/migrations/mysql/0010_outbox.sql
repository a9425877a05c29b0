-- Tenax schema, version 10: the outbox of outbound deliveries (completion callbacks and
-- death alerts). A row is written by the trigger below in the same transaction as the
-- status change that causes it, so every path that finishes a task (completion,
-- failure, the reaper, cancels one by one, in bulk or through a workflow) is covered.
-- Additive: a node of the previous version never reads the table, and its updates fire
-- the trigger like any other. Times are DATETIME(6) holding UTC.
--
-- With binary logging on, creating a trigger needs the SUPER privilege or
-- log_bin_trust_function_creators = 1 (see Storage::migrate).
ALTER TABLE tenax_tasks ADD COLUMN callback_url TEXT NULL;

CREATE TABLE tenax_outbox (
    id              BIGINT       NOT NULL AUTO_INCREMENT,
    -- Stable across redeliveries: receivers deduplicate on it.
    delivery_id     VARCHAR(64)  NOT NULL,
    kind            VARCHAR(16)  NOT NULL CHECK (kind IN ('callback', 'death')),
    task_id         BIGINT       NOT NULL,
    -- Where a callback goes; NULL for a death (alerts go to the configured webhook).
    url             TEXT         NULL,
    -- The task summary as JSON text, fixed when the row is written.
    body            LONGTEXT     NOT NULL,
    status          VARCHAR(16)  NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'expired')),
    -- Claims so far; a settle names the claim it ends.
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NOT NULL,
    last_error      TEXT         NULL,
    created_at      DATETIME(6)  NOT NULL,
    settled_at      DATETIME(6)  NULL,
    PRIMARY KEY (id),
    UNIQUE KEY tenax_outbox_delivery (delivery_id),
    KEY tenax_outbox_due (status, kind, next_attempt_at, id),
    KEY tenax_outbox_settled (status, settled_at),
    KEY tenax_outbox_task (task_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TRIGGER tenax_outbox_on_finish AFTER UPDATE ON tenax_tasks FOR EACH ROW
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
           OR (k.kind = 'death' AND NEW.status = 'dead'));
