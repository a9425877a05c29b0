-- Tenax schema, version 6: business-key concurrency. Additive: nodes of earlier versions
-- keep running, but they know nothing of keys and would claim keyed tasks without
-- checking them: finish the deploy before enqueueing tasks with a concurrency key.
--
-- A task with a concurrency_key runs only while fewer than its concurrency_limit tasks
-- with the same key are running, across all nodes. The claim takes keyed tasks after
-- locking the keys' rows of tenax_concurrency_keys (in name order, so claimers never
-- deadlock) and counts their running tasks after the lock (READ COMMITTED).
--
-- has_key is a generated column so the keyed claim walks an index of keyed tasks only
-- (MariaDB has no partial indexes).
ALTER TABLE tenax_tasks
    ADD COLUMN concurrency_key VARCHAR(160) NULL,
    ADD COLUMN concurrency_limit INT NOT NULL DEFAULT 1
        CHECK (concurrency_limit BETWEEN 1 AND 1000),
    ADD COLUMN has_key TINYINT GENERATED ALWAYS AS (concurrency_key IS NOT NULL) VIRTUAL,
    ADD KEY tenax_tasks_keyed_claim (status, has_key, queue, claim_key, id),
    ADD KEY tenax_tasks_running_key (status, concurrency_key);

CREATE TABLE tenax_concurrency_keys (
    name VARCHAR(160) NOT NULL,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
