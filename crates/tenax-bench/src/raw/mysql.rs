//! Raw-SQL baselines for `tenax bench` on MariaDB/MySQL: the same columns Tenax
//! writes, on the same table and indexes, through the storage's pool (which has
//! Tenax's session settings, READ COMMITTED among them). Not part of the `Storage`
//! seam.
//!
//! The claim is the one MariaDB allows: lock the due ids in claim order (`FOR UPDATE
//! SKIP LOCKED`, walking the claim index), write them by primary key, open their
//! attempts and read the leases back, in one transaction; the completion is one
//! `UPDATE` per table for the whole batch, fenced by each task's epoch, in another.
use anyhow::Result;
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::mysql::{MySql, MySqlPool};
use sqlx::{QueryBuilder, Row};
use tenax_storage::mysql::MySqlStorage;

use super::Window;

/// The database clock, as Tenax's writes take it (UTC, microseconds).
const NOW: &str = "UTC_TIMESTAMP(6)";

/// MySQL stops a recursive `WITH` after 1,000 rows by default: inserts go in batches
/// of at most this many.
const INSERT_BATCH: u64 = 1_000;

/// Counts and window of the tasks table; `since_id` leaves out older rows (0 for all).
pub(crate) async fn window(storage: &MySqlStorage, since_id: i64) -> Result<Window> {
    let row = sqlx::query(
        "SELECT CAST(COALESCE(SUM(status = 'succeeded'), 0) AS SIGNED) AS succeeded,
                CAST(COALESCE(SUM(status <> 'succeeded'), 0) AS SIGNED) AS other,
                MIN(CASE WHEN status = 'succeeded' THEN started_at END) AS first_start,
                MAX(CASE WHEN status = 'succeeded' THEN finished_at END) AS last_finish
         FROM tenax_tasks WHERE id > ?",
    )
    .bind(since_id)
    .fetch_one(storage.pool())
    .await?;
    let time = |name: &str| -> Result<Option<DateTime<Utc>>> {
        Ok(row
            .try_get::<Option<NaiveDateTime>, _>(name)?
            .map(|t| t.and_utc()))
    };
    Ok(Window {
        succeeded: u64::try_from(row.try_get::<i64, _>("succeeded")?).unwrap_or(0),
        other: u64::try_from(row.try_get::<i64, _>("other")?).unwrap_or(0),
        first_start: time("first_start")?,
        last_finish: time("last_finish")?,
    })
}

/// The highest task id so far (0 when the table is empty).
pub(crate) async fn max_id(storage: &MySqlStorage) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT CAST(COALESCE(MAX(id), 0) AS SIGNED) FROM tenax_tasks")
            .fetch_one(storage.pool())
            .await?,
    )
}

/// Empty the tasks and their attempt history, and refresh the index statistics.
pub(crate) async fn reset(storage: &MySqlStorage) -> Result<()> {
    let mut tx = storage.pool().begin().await?;
    for sql in ["DELETE FROM tenax_attempts", "DELETE FROM tenax_tasks"] {
        sqlx::query(sql).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    analyze(storage).await
}

/// Refresh the optimizer's statistics of the tasks table (after a bulk load).
pub(crate) async fn analyze(storage: &MySqlStorage) -> Result<()> {
    sqlx::query("ANALYZE TABLE tenax_tasks")
        .execute(storage.pool())
        .await?;
    Ok(())
}

/// Insert `tasks` `NOOP` tasks of the `default` queue, one multi-row `INSERT` (and one
/// commit) per `batch` (at most [`INSERT_BATCH`]), the rows made by the database, as
/// pending or (`finished`) already succeeded; task numbers start with `prefix`.
pub(crate) async fn raw_insert(
    storage: &MySqlStorage,
    tasks: u64,
    batch: u64,
    prefix: &str,
    finished: bool,
) -> Result<()> {
    let (status, attempt, finished_at, result) = if finished {
        ("succeeded", 1, NOW, "'null'")
    } else {
        ("pending", 0, "NULL", "NULL")
    };
    let sql = format!(
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             attempt, max_attempts, lease_epoch, run_at, timeout_ms, created_at, updated_at,
             started_at, finished_at, result, events)
         WITH RECURSIVE g(n) AS (SELECT CAST(? AS SIGNED) UNION ALL SELECT n + 1 FROM g WHERE n < ?)
         SELECT CONCAT(?, n), 'NOOP', CONCAT('{{\"order\":', n, ',\"note\":\"bench\"}}'),
                'default', 5, '{status}', {attempt}, 5, {attempt}, {NOW}, 30000, {NOW}, {NOW},
                {finished_at}, {finished_at}, {result}, 0
         FROM g"
    );
    let batch = batch.clamp(1, INSERT_BATCH);
    let mut start = 0;
    while start < tasks {
        let end = (start + batch).min(tasks);
        sqlx::query(&sql)
            .bind(i64::try_from(start).unwrap_or(i64::MAX))
            .bind(i64::try_from(end).unwrap_or(i64::MAX) - 1)
            .bind(prefix)
            .execute(storage.pool())
            .await?;
        start = end;
    }
    Ok(())
}

/// `(id, epoch)` leases of one claimed batch.
type Leases = Vec<(i64, i64)>;

/// `IN (?, ?, ...)` over the leases' ids.
fn push_ids(qb: &mut QueryBuilder<'_, MySql>, leases: &Leases) {
    qb.push(" IN (");
    let mut ids = qb.separated(", ");
    for (id, _) in leases {
        ids.push_bind(*id);
    }
    ids.push_unseparated(")");
}

/// `CASE <column> WHEN ? THEN ? ... END`: each lease's epoch by its id.
fn push_epochs(qb: &mut QueryBuilder<'_, MySql>, column: &str, leases: &Leases) {
    qb.push(format!(" CASE {column}"));
    for (id, epoch) in leases {
        qb.push(" WHEN ")
            .push_bind(*id)
            .push(" THEN ")
            .push_bind(*epoch);
    }
    qb.push(" END");
}

/// One claim of at most `batch` due tasks, in one transaction; returns their leases.
async fn claim(pool: &MySqlPool, batch: i64, worker: &str) -> Result<Leases> {
    let mut tx = pool.begin().await?;
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM tenax_tasks
         WHERE status = 'pending' AND queue = 'default' AND run_at <= UTC_TIMESTAMP(6)
         ORDER BY priority DESC, run_at, id LIMIT ? FOR UPDATE SKIP LOCKED",
    )
    .bind(batch)
    .fetch_all(&mut *tx)
    .await?;
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(Vec::new());
    }
    let leases: Leases = ids.iter().map(|id| (*id, 0)).collect();
    let mut qb = QueryBuilder::new(
        "UPDATE tenax_tasks
         SET status = 'running', attempt = attempt + 1, lease_epoch = lease_epoch + 1,
             lease_owner = ",
    );
    qb.push_bind(worker).push(format!(
        ", lease_expires_at = {NOW} + INTERVAL 30 SECOND,
           started_at = COALESCE(started_at, {NOW}), updated_at = {NOW}
         WHERE id"
    ));
    push_ids(&mut qb, &leases);
    qb.build().execute(&mut *tx).await?;
    let mut qb = QueryBuilder::new(
        "INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
         SELECT id, lease_epoch, attempt, ",
    );
    qb.push_bind(worker)
        .push(format!(", {NOW}, 'running' FROM tenax_tasks WHERE id"));
    push_ids(&mut qb, &leases);
    qb.build().execute(&mut *tx).await?;
    let mut qb = QueryBuilder::new("SELECT id, lease_epoch FROM tenax_tasks WHERE id");
    push_ids(&mut qb, &leases);
    let leases: Leases = qb.build_query_as().fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(leases)
}

/// The completion of one claimed batch, fenced by each task's epoch: one statement
/// per table, one commit. Returns the tasks finished.
async fn complete(pool: &MySqlPool, leases: &Leases) -> Result<u64> {
    let mut tx = pool.begin().await?;
    let mut qb = QueryBuilder::new(format!(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = 'null', finished_at = {NOW}, updated_at = {NOW},
             lease_owner = NULL, lease_expires_at = NULL
         WHERE status = 'running' AND id"
    ));
    push_ids(&mut qb, leases);
    qb.push(" AND lease_epoch =");
    push_epochs(&mut qb, "id", leases);
    let done = qb.build().execute(&mut *tx).await?.rows_affected();
    let mut qb = QueryBuilder::new(format!(
        "UPDATE tenax_attempts SET finished_at = {NOW}, outcome = 'succeeded' WHERE task_id"
    ));
    push_ids(&mut qb, leases);
    qb.push(" AND epoch =");
    push_epochs(&mut qb, "task_id", leases);
    qb.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(done)
}

/// Drain the due tasks with `clients` concurrent loops of claim `batch` + complete
/// `batch` (two commits per batch, like the database's own claim+complete limit).
/// Returns the tasks finished.
pub(crate) async fn raw_drain(storage: &MySqlStorage, clients: u32, batch: u32) -> Result<u64> {
    let mut loops = tokio::task::JoinSet::new();
    for client in 0..clients.max(1) {
        let pool = storage.pool().clone();
        loops.spawn(async move {
            let worker = format!("baseline-{client}");
            let mut done = 0;
            loop {
                let leases = claim(&pool, i64::from(batch), &worker).await?;
                if leases.is_empty() {
                    return anyhow::Ok(done);
                }
                done += complete(&pool, &leases).await?;
            }
        });
    }
    let mut done = 0;
    while let Some(joined) = loops.join_next().await {
        done += joined??;
    }
    Ok(done)
}
