-- Tenax schema, version 12: queue threshold alerts go through the outbox like every
-- other outbound delivery. A recorded change of a threshold alert writes an `alert`
-- row in the same transaction, so the message survives a restart and is retried until
-- the webhook acknowledges it. Such a row names no task (task_id 0). Additive: nodes
-- of version 11 never claim `alert` rows.
ALTER TABLE tenax_outbox MODIFY kind VARCHAR(16) NOT NULL
    CHECK (kind IN ('callback', 'death', 'alert'));
