-- Tenax schema, version 6: business-key concurrency. Additive: nodes of earlier versions
-- keep running, but they know nothing of keys and would claim keyed tasks without
-- checking them: finish the deploy before enqueueing tasks with a concurrency key.
--
-- A task with a concurrency_key runs only while fewer than its concurrency_limit tasks
-- with the same key are running, across all nodes. The claim takes keyed tasks in a
-- transaction that locks the keys' rows of tenax_concurrency_keys (in name order, so
-- claimers never deadlock) and counts their running tasks after the lock.
ALTER TABLE tenax_tasks
    ADD COLUMN concurrency_key TEXT CHECK (octet_length(concurrency_key) BETWEEN 1 AND 160),
    ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 1
        CHECK (concurrency_limit BETWEEN 1 AND 1000);

-- The keyed claim walks only keyed due tasks; the fast claim leaves them out.
CREATE INDEX tenax_tasks_keyed_claim ON tenax_tasks (queue, tenax_claim_key(run_at, priority), id)
    WHERE status IN ('pending', 'retrying') AND concurrency_key IS NOT NULL;

-- Running tasks per key, counted by every keyed claim.
CREATE INDEX tenax_tasks_running_key ON tenax_tasks (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- One row per key ever claimed: the lock claimers of one key take turns on.
CREATE TABLE tenax_concurrency_keys (
    name TEXT PRIMARY KEY
);
