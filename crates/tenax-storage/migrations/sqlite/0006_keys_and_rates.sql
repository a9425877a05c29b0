-- Tenax schema, version 6: business-key concurrency. Additive: nodes of earlier versions
-- keep running, but they know nothing of keys and would claim keyed tasks without
-- checking them: finish the deploy before enqueueing tasks with a concurrency key.
--
-- A task with a concurrency_key runs only while fewer than its concurrency_limit tasks
-- with the same key are running. SQLite has one writer at a time, so the claim counts a
-- key's running tasks inside its transaction and needs no lock rows.
ALTER TABLE tenax_tasks ADD COLUMN concurrency_key TEXT
    CHECK (concurrency_key IS NULL OR length(CAST(concurrency_key AS BLOB)) BETWEEN 1 AND 160);
ALTER TABLE tenax_tasks ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 1
    CHECK (concurrency_limit BETWEEN 1 AND 1000);

-- The keyed claim walks only keyed due tasks; the fast claim leaves them out.
CREATE INDEX tenax_tasks_keyed_claim ON tenax_tasks (queue, run_at - priority * 60000, id)
    WHERE status IN ('pending', 'retrying') AND concurrency_key IS NOT NULL;

-- Running tasks per key, counted by every keyed claim.
CREATE INDEX tenax_tasks_running_key ON tenax_tasks (concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
