-- Tenax schema, version 15: the claim index of version 2 goes. Since version 3 every
-- claim orders by tenax_claim_key(run_at, priority) through tenax_tasks_claim_key, and
-- no statement reads tenax_tasks_claim (queue, priority DESC, run_at, id); version 3
-- kept it for the nodes of version 2 during that deploy. Each insert of a waiting task
-- still paid an entry in it: about a quarter of a 1,000-row insert's time. A node of
-- an earlier version that still claimed through it would claim correctly, only without
-- the index.
DROP INDEX IF EXISTS tenax_tasks_claim;
