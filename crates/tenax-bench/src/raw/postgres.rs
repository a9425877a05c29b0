//! Raw-SQL baselines for `tenax bench` on PostgreSQL: the smallest statements that
//! write the same columns Tenax writes, on the same table and indexes, so that a Tenax
//! figure can be read as a ratio to what the database itself can do. Not part of the
//! `Storage` seam: nothing here is used by workers or clients.
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::Row;
use tenax_storage::postgres::PgStorage;

use super::Window;

/// Counts and window of the tasks table; `since_id` leaves out older rows (0 for all).
pub(crate) async fn window(storage: &PgStorage, since_id: i64) -> Result<Window> {
    let row = sqlx::query(
        "SELECT count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
                count(*) FILTER (WHERE status <> 'succeeded') AS other,
                min(started_at) FILTER (WHERE status = 'succeeded') AS first_start,
                max(finished_at) FILTER (WHERE status = 'succeeded') AS last_finish
         FROM tenax_tasks WHERE id > $1",
    )
    .bind(since_id)
    .fetch_one(storage.pool())
    .await?;
    Ok(Window {
        succeeded: u64::try_from(row.try_get::<i64, _>("succeeded")?).unwrap_or(0),
        other: u64::try_from(row.try_get::<i64, _>("other")?).unwrap_or(0),
        first_start: row.try_get("first_start")?,
        last_finish: row.try_get("last_finish")?,
    })
}

/// The highest task id so far (0 when the table is empty).
pub(crate) async fn max_id(storage: &PgStorage) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(max(id), 0) FROM tenax_tasks")
            .fetch_one(storage.pool())
            .await?,
    )
}

/// Empty the tasks and their attempt history, and refresh the planner's statistics.
pub(crate) async fn reset(storage: &PgStorage) -> Result<()> {
    sqlx::query("TRUNCATE tenax_tasks, tenax_attempts")
        .execute(storage.pool())
        .await?;
    analyze(storage).await
}

/// Refresh the planner's statistics of the tasks table (after a bulk load).
pub(crate) async fn analyze(storage: &PgStorage) -> Result<()> {
    sqlx::query("VACUUM ANALYZE tenax_tasks")
        .execute(storage.pool())
        .await?;
    Ok(())
}

/// The priority of every baseline row (a literal in the statements below): Tenax's
/// default, which the bench's own tasks get. The value matters to an insert's cost:
/// rows of one priority with rising `run_at` land at the right edge of the claim
/// indexes, where PostgreSQL's B-tree inserts without a descent. Priority 0 rows
/// next to Tenax's priority 5 rows took that fast path alone: about 1.8 ms of 9 per
/// 1,000 rows.
const BENCH_PRIORITY: i16 = 5;

/// Insert `tasks` `NOOP` tasks of the `default` queue with one multi-row `INSERT` per
/// `batch`, each with its own commit: the columns a Tenax enqueue writes, with the
/// payload and task number built by the database. The `events` flag is written as the
/// constant it is here (a bench schema has no event rules), so that Tenax's row trigger,
/// which fills an unset flag, does not fire: the baseline is the database's own insert,
/// not Tenax's trigger. `finished` inserts them as already
/// succeeded (to fill the table for the scale run); task numbers start with `prefix`.
pub(crate) async fn raw_insert(
    storage: &PgStorage,
    tasks: u64,
    batch: u64,
    prefix: &str,
    finished: bool,
) -> Result<()> {
    insert_rows(storage.pool(), tasks, batch, prefix, finished).await
}

async fn insert_rows(
    pool: &PgPool,
    tasks: u64,
    batch: u64,
    prefix: &str,
    finished: bool,
) -> Result<()> {
    let sql = if finished {
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             attempt, max_attempts, lease_epoch, run_at, timeout_ms, created_at, updated_at,
             started_at, finished_at, result, events)
         SELECT $3 || g, 'NOOP', '{\"order\":' || g || ',\"note\":\"bench\"}', 'default', 5,
                'succeeded', 1, 5, 1, now(), 30000, now(), now(), now(), now(), 'null', FALSE
         FROM generate_series($1::bigint, $2::bigint) g"
    } else {
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at, events)
         SELECT $3 || g, 'NOOP', '{\"order\":' || g || ',\"note\":\"bench\"}', 'default', 5,
                'pending', 5, now(), 30000, now(), now(), FALSE
         FROM generate_series($1::bigint, $2::bigint) g"
    };
    let batch = batch.max(1);
    let mut start = 0;
    while start < tasks {
        let end = (start + batch).min(tasks);
        sqlx::query(sql)
            .bind(i64::try_from(start).unwrap_or(i64::MAX))
            .bind(i64::try_from(end).unwrap_or(i64::MAX) - 1)
            .bind(prefix)
            .execute(pool)
            .await?;
        start = end;
    }
    Ok(())
}

/// The values per row the client-sent baseline binds: the columns of a task that a
/// caller chooses (everything a Tenax bulk insert sends per task, but the delay and
/// the workflow's key and parents, which a plain task leaves empty).
const SENT_COLUMNS: usize = 11;

/// Insert `tasks` `NOOP` tasks of the `default` queue with one multi-row
/// `INSERT ... VALUES (...), (...)` per `batch`, each with its own commit, every row's
/// values built on the client and sent as parameters (`task_no`, command type, payload
/// text, queue, priority, attempts, timeout, payload version, concurrency key and
/// limit, callback URL); the status, times and `events` flag are constants of the
/// statement, as in [`raw_insert`]. This is what a hand-written queue sends for a
/// batch, so it pays what Tenax pays to build and send each row's values, which
/// [`raw_insert`] (its rows made by the database) does not. Task numbers start with
/// `prefix`.
pub(crate) async fn raw_insert_sent(
    storage: &PgStorage,
    tasks: u64,
    batch: u64,
    prefix: &str,
) -> Result<()> {
    // PostgreSQL takes at most 65,535 parameters in one statement.
    let batch = batch.clamp(1, (u64::from(u16::MAX) / SENT_COLUMNS as u64).max(1));
    let mut next = 0;
    while next < tasks {
        let stop = (next + batch).min(tasks);
        let mut qb = sqlx::QueryBuilder::<sqlx::Postgres>::new(
            "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority,
                 max_attempts, timeout_ms, payload_version, concurrency_key, concurrency_limit,
                 callback_url, status, run_at, created_at, updated_at, events) ",
        );
        qb.push_values(next..stop, |mut row, i| {
            row.push_bind(format!("{prefix}{i}"))
                .push_bind("NOOP")
                .push_bind(format!(r#"{{"order":{i},"note":"bench"}}"#))
                .push_bind("default")
                .push_bind(BENCH_PRIORITY)
                .push_bind(5i32)
                .push_bind(30_000i64)
                .push_bind(1i32)
                .push_bind(None::<&str>)
                .push_bind(1i32)
                .push_bind(None::<&str>)
                .push("'pending', now(), now(), now(), FALSE");
        });
        qb.build().execute(storage.pool()).await?;
        next = stop;
    }
    Ok(())
}

/// The baseline claim: the due tasks of the `default` queue in claim order, skipping
/// locked rows, moved to running with a lease, and their attempt opened; one statement.
const CLAIM: &str = "WITH due AS (
         SELECT id FROM tenax_tasks
         WHERE queue = 'default' AND status IN ('pending', 'retrying')
           AND tenax_claim_key(run_at, priority) <= now() AND run_at <= now()
         ORDER BY tenax_claim_key(run_at, priority), id
         LIMIT $1 FOR UPDATE SKIP LOCKED
     ), claimed AS (
         UPDATE tenax_tasks t
         SET status = 'running', attempt = t.attempt + 1, lease_epoch = t.lease_epoch + 1,
             lease_owner = $2, lease_expires_at = now() + interval '30 seconds',
             started_at = COALESCE(t.started_at, now()), updated_at = now()
         FROM due WHERE t.id = due.id
         RETURNING t.id, t.lease_epoch, t.attempt
     ), history AS (
         INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
         SELECT id, lease_epoch, attempt, $2, now(), 'running' FROM claimed
     )
     SELECT id, lease_epoch FROM claimed";

/// The baseline completion of a claimed batch: one statement for the tasks (still
/// conditional on the lease) and one for their attempts, in one commit.
const COMPLETE: &str = "WITH done AS (
         UPDATE tenax_tasks t
         SET status = 'succeeded', result = 'null', finished_at = now(), updated_at = now(),
             lease_owner = NULL, lease_expires_at = NULL
         FROM unnest($1::int8[], $2::int8[]) AS l(id, epoch)
         WHERE t.id = l.id AND t.status = 'running' AND t.lease_epoch = l.epoch
         RETURNING t.id, t.lease_epoch
     )
     UPDATE tenax_attempts a SET finished_at = now(), outcome = 'succeeded'
     FROM done WHERE a.task_id = done.id AND a.epoch = done.lease_epoch";

/// One client's claim-and-complete round: returns how many tasks it finished.
async fn claim_complete_once(pool: &PgPool, batch: i64, worker: &str) -> Result<u64> {
    let rows = sqlx::query(CLAIM)
        .bind(batch)
        .bind(worker)
        .fetch_all(pool)
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut ids = Vec::with_capacity(rows.len());
    let mut epochs = Vec::with_capacity(rows.len());
    for row in &rows {
        ids.push(row.try_get::<i64, _>(0)?);
        epochs.push(row.try_get::<i64, _>(1)?);
    }
    sqlx::query(COMPLETE)
        .bind(&ids)
        .bind(&epochs)
        .execute(pool)
        .await?;
    Ok(rows.len() as u64)
}

/// The database's own floor of an enqueue-to-start latency, `samples` times: one task
/// inserted (its own commit), then claimed at once by the baseline claim (its own
/// commit), timed from just before the insert until the claim returns it; no wake-up,
/// no worker, nothing but the two statements Tenax's path also holds. Returns the
/// samples in milliseconds.
pub(crate) async fn raw_latency(storage: &PgStorage, samples: usize) -> Result<Vec<f64>> {
    let pool = storage.pool();
    let mut taken = Vec::with_capacity(samples);
    for n in 0..samples {
        let started = std::time::Instant::now();
        insert_rows(pool, 1, 1, &format!("floor-{n}-"), false).await?;
        let claimed = sqlx::query(CLAIM)
            .bind(1i64)
            .bind("baseline")
            .fetch_all(pool)
            .await?;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        if claimed.len() != 1 {
            anyhow::bail!(
                "the floor's claim took {} tasks, not the one inserted",
                claimed.len()
            );
        }
        taken.push(took);
    }
    Ok(taken)
}

/// Drain the due tasks with `clients` concurrent loops of claim `batch` + complete
/// `batch` (two commits per batch, like the database's own claim+complete limit).
/// Returns the tasks finished.
pub(crate) async fn raw_drain(storage: &PgStorage, clients: u32, batch: u32) -> Result<u64> {
    let mut loops = tokio::task::JoinSet::new();
    for client in 0..clients.max(1) {
        let pool = storage.pool().clone();
        loops.spawn(async move {
            let worker = format!("baseline-{client}");
            let mut done = 0;
            loop {
                let n = claim_complete_once(&pool, i64::from(batch), &worker).await?;
                if n == 0 {
                    return anyhow::Ok(done);
                }
                done += n;
            }
        });
    }
    let mut done = 0;
    while let Some(joined) = loops.join_next().await {
        done += joined??;
    }
    Ok(done)
}

/// The smallest life cycle for `duration`: each of `clients` loops inserts `batch`
/// tasks (one commit), claims `batch` (one commit) and completes them (one commit).
/// Returns the tasks that went through the whole cycle.
pub(crate) async fn raw_lifecycle(
    storage: &PgStorage,
    clients: u32,
    batch: u32,
    duration: Duration,
) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + duration;
    let mut loops = tokio::task::JoinSet::new();
    for client in 0..clients.max(1) {
        let pool = storage.pool().clone();
        loops.spawn(async move {
            let worker = format!("baseline-{client}");
            let mut done = 0;
            let mut round = 0u64;
            while tokio::time::Instant::now() < deadline {
                let prefix = format!("life-{client}-{round}-");
                insert_rows(&pool, u64::from(batch), u64::from(batch), &prefix, false).await?;
                done += claim_complete_once(&pool, i64::from(batch), &worker).await?;
                round += 1;
            }
            anyhow::Ok(done)
        });
    }
    let mut done = 0;
    while let Some(joined) = loops.join_next().await {
        done += joined??;
    }
    Ok(done)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of Tenax's own fast-path claim of `limit` tasks of the
/// `default` queue for `NOOP`, run in a transaction that is rolled back (nothing moves).
/// An `EXPLAIN` with bound values is planned for those values: the one plan the
/// claim's own connections keep is what `PgStorage::explain_claim` shows.
pub(crate) async fn explain_claim(storage: &PgStorage, limit: u32) -> Result<String> {
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS) {}",
        tenax_storage::postgres::claim_sql(false, false)
    );
    let mut tx = storage.pool().begin().await?;
    let rows = sqlx::query(&sql)
        .bind(None::<DateTime<Utc>>)
        .bind(vec!["default".to_owned()])
        .bind(vec!["NOOP".to_owned()])
        .bind(i64::from(limit))
        .bind("explain")
        .bind(30_000f64)
        .bind(tenax_storage::ATTEMPT_HISTORY_LEN)
        .bind(vec![i32::MAX])
        .bind(vec![i64::from(limit)])
        .fetch_all(&mut *tx)
        .await?;
    tx.rollback().await?;
    let mut plan = String::new();
    for row in &rows {
        plan.push_str(&row.try_get::<String, _>(0)?);
        plan.push('\n');
    }
    Ok(plan)
}
