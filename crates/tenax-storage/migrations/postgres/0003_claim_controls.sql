-- Tenax schema, version 3: claim controls. Additive: nodes of the previous version keep
-- running (they still claim by priority, then run time, through tenax_tasks_claim; a
-- later version drops that index).
--
-- Priorities age: the claim orders due tasks by tenax_claim_key(run_at, priority) =
-- run_at - priority * 60 s (tenax_core::PRIORITY_AGING_STEP), then id, so a priority-0
-- task is overtaken only by tasks due less than 9 minutes after it.
--
-- An expression index rather than a stored column: PostgreSQL computes it on every write
-- that sets run_at or priority, including the writes of nodes of the previous version,
-- which know nothing of the key, and no existing row has to be rewritten. The function
-- is declared IMMUTABLE, which the built-in timestamptz - interval is not (an interval
-- with days or months depends on the TimeZone setting); an interval of whole seconds
-- does not, so the key is the same in every session.
CREATE FUNCTION tenax_claim_key(run_at timestamptz, priority smallint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT run_at - priority * interval '60 seconds' $$;

CREATE INDEX tenax_tasks_claim_key ON tenax_tasks (queue, tenax_claim_key(run_at, priority), id)
    WHERE status IN ('pending', 'retrying');

-- Queue controls. A queue needs no row: a queue without one is unpaused and unlimited,
-- and the claim takes its fast path. Nodes of the previous version do not read this
-- table: finish the deploy before relying on pause and limits.
CREATE TABLE tenax_queues (
    name        TEXT        PRIMARY KEY,
    paused      BOOLEAN     NOT NULL DEFAULT false,
    max_running INTEGER     CHECK (max_running IS NULL OR max_running >= 1),
    updated_at  TIMESTAMPTZ NOT NULL
);
