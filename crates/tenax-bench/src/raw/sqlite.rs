//! Raw-SQL baselines for `tenax bench` on SQLite: the same columns Tenax writes, on
//! the same table and indexes, each write one `BEGIN IMMEDIATE` transaction as
//! Tenax's are (on a connection of the storage's pool, which has Tenax's settings).
//! Not part of the `Storage` seam.
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use sqlx::sqlite::Sqlite;
use sqlx::{Row, Transaction};
use tenax_storage::sqlite::SqliteStorage;

use super::Window;

/// The database clock in milliseconds, as Tenax's writes take it.
const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// A write transaction, begun as Tenax begins its own.
async fn begin(storage: &SqliteStorage) -> Result<Transaction<'static, Sqlite>> {
    Ok(storage.pool().begin_with("BEGIN IMMEDIATE").await?)
}

/// A time of the tasks table (milliseconds since the Unix epoch).
fn ms(value: i64) -> Result<DateTime<Utc>> {
    DateTime::from_timestamp_millis(value)
        .with_context(|| format!("corrupt row: time {value} ms is out of range"))
}

/// Counts and window of the tasks table; `since_id` leaves out older rows (0 for all).
pub(crate) async fn window(storage: &SqliteStorage, since_id: i64) -> Result<Window> {
    let row = sqlx::query(
        "SELECT COALESCE(SUM(status = 'succeeded'), 0) AS succeeded,
                COALESCE(SUM(status <> 'succeeded'), 0) AS other,
                MIN(CASE WHEN status = 'succeeded' THEN started_at END) AS first_start,
                MAX(CASE WHEN status = 'succeeded' THEN finished_at END) AS last_finish
         FROM tenax_tasks WHERE id > ?1",
    )
    .bind(since_id)
    .fetch_one(storage.pool())
    .await?;
    let time =
        |name: &str| -> Result<_> { row.try_get::<Option<i64>, _>(name)?.map(ms).transpose() };
    Ok(Window {
        succeeded: u64::try_from(row.try_get::<i64, _>("succeeded")?).unwrap_or(0),
        other: u64::try_from(row.try_get::<i64, _>("other")?).unwrap_or(0),
        first_start: time("first_start")?,
        last_finish: time("last_finish")?,
    })
}

/// The highest task id so far (0 when the table is empty).
pub(crate) async fn max_id(storage: &SqliteStorage) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM tenax_tasks")
            .fetch_one(storage.pool())
            .await?,
    )
}

/// Empty the tasks and their attempt history.
pub(crate) async fn reset(storage: &SqliteStorage) -> Result<()> {
    let mut tx = begin(storage).await?;
    for sql in ["DELETE FROM tenax_tasks", "DELETE FROM tenax_attempts"] {
        sqlx::query(sql).execute(&mut *tx).await?;
    }
    Ok(tx.commit().await?)
}

/// Insert `tasks` `NOOP` tasks of the `default` queue, one multi-row `INSERT` (and one
/// commit) per `batch`, as pending or (`finished`) already succeeded.
pub(crate) async fn raw_insert(
    storage: &SqliteStorage,
    tasks: u64,
    batch: u64,
    prefix: &str,
    finished: bool,
) -> Result<()> {
    let (status, finished_at) = if finished {
        ("succeeded", NOW)
    } else {
        ("pending", "NULL")
    };
    let sql = format!(
        "WITH RECURSIVE g(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
         INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at, started_at, finished_at)
         SELECT ?3 || n, 'NOOP', '{{\"order\":' || n || ',\"note\":\"bench\"}}', 'default', 5,
                '{status}', 5, {NOW}, 30000, {NOW}, {NOW}, {finished_at}, {finished_at}
         FROM g"
    );
    let batch = batch.max(1);
    let mut start = 0;
    while start < tasks {
        let end = (start + batch).min(tasks);
        let mut tx = begin(storage).await?;
        sqlx::query(&sql)
            .bind(i64::try_from(start).unwrap_or(i64::MAX))
            .bind(i64::try_from(end).unwrap_or(i64::MAX) - 1)
            .bind(prefix)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        start = end;
    }
    Ok(())
}

/// Drain the due tasks with one loop of claim `batch` (one commit, attempts opened) +
/// complete `batch` (one commit, attempts closed), each step one statement per table
/// for the whole batch, as `L2` of the database's own limits. Returns the tasks
/// finished.
pub(crate) async fn raw_drain(storage: &SqliteStorage, batch: u32) -> Result<u64> {
    let claim = format!(
        "UPDATE tenax_tasks
         SET status = 'running', attempt = attempt + 1, lease_epoch = lease_epoch + 1,
             lease_owner = 'baseline', lease_expires_at = {NOW} + 30000,
             started_at = COALESCE(started_at, {NOW}), updated_at = {NOW}
         WHERE id IN (SELECT id FROM tenax_tasks
                      WHERE status IN ('pending', 'retrying') AND run_at <= {NOW}
                        AND queue = 'default'
                      ORDER BY run_at - priority * 60000, id LIMIT ?1)
         RETURNING id, lease_epoch, attempt"
    );
    let open = format!(
        "INSERT INTO tenax_attempts (task_id, epoch, attempt, worker, started_at, outcome)
         SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
                json_extract(value, '$[2]'), 'baseline', {NOW}, 'running'
         FROM json_each(?1)"
    );
    let complete = format!(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = 'null', finished_at = {NOW},
             updated_at = {NOW}, lease_owner = NULL, lease_expires_at = NULL
         FROM json_each(?1) AS l
         WHERE tenax_tasks.id = json_extract(l.value, '$[0]') AND tenax_tasks.status = 'running'
           AND tenax_tasks.lease_epoch = json_extract(l.value, '$[1]')"
    );
    let close = format!(
        "UPDATE tenax_attempts SET finished_at = {NOW}, outcome = 'succeeded'
         FROM json_each(?1) AS l
         WHERE tenax_attempts.task_id = json_extract(l.value, '$[0]')
           AND tenax_attempts.epoch = json_extract(l.value, '$[1]')"
    );
    let mut done = 0;
    loop {
        let mut tx = begin(storage).await?;
        let leases: Vec<(i64, i64, i64)> = sqlx::query_as(&claim)
            .bind(i64::from(batch))
            .fetch_all(&mut *tx)
            .await?;
        if leases.is_empty() {
            tx.rollback().await?;
            return Ok(done);
        }
        let leases = serde_json::to_string(&leases)?;
        sqlx::query(&open).bind(&leases).execute(&mut *tx).await?;
        tx.commit().await?;
        let mut tx = begin(storage).await?;
        let finished = sqlx::query(&complete)
            .bind(&leases)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query(&close).bind(&leases).execute(&mut *tx).await?;
        tx.commit().await?;
        done += finished;
    }
}
