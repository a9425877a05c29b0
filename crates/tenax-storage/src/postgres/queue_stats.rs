//! [`Storage::queue_stats`](crate::Storage::queue_stats) and
//! [`Storage::stats`](crate::Storage::stats) on PostgreSQL.
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use tenax_core::TaskStatus;

use super::map_err;
use crate::error::Result;
use crate::params::{QueueStats, Stats};
use crate::queue_stats::{age_from_ms, fold, QueueStatusRow};

/// Counts by queue and status, with each queue's backlog and oldest due age: one
/// read-only statement on the database clock (or the override).
pub(super) async fn queue_stats(
    pool: &PgPool,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<QueueStats>> {
    let rows = sqlx::query(
        "WITH clock AS (SELECT COALESCE($1::timestamptz, now()) AS now)
         SELECT queue, status, COUNT(*)::int8 AS n,
                COUNT(*) FILTER (WHERE run_at <= clock.now)::int8 AS due,
                (EXTRACT(EPOCH FROM (clock.now - MIN(run_at) FILTER (WHERE run_at <= clock.now)))
                    * 1000)::float8 AS oldest_ms
         FROM tenax_tasks CROSS JOIN clock
         GROUP BY queue, status, clock.now",
    )
    .bind(now)
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let status: String = row.try_get("status").map_err(map_err)?;
        let count: i64 = row.try_get("n").map_err(map_err)?;
        let due: i64 = row.try_get("due").map_err(map_err)?;
        let oldest_ms: Option<f64> = row.try_get("oldest_ms").map_err(map_err)?;
        out.push(QueueStatusRow {
            queue: row.try_get("queue").map_err(map_err)?,
            status: status.parse::<TaskStatus>()?,
            count: u64::try_from(count).unwrap_or(0),
            due: u64::try_from(due).unwrap_or(0),
            oldest_due_age: oldest_ms.map(age_from_ms),
        });
    }
    Ok(fold(out))
}

/// Counts by command type and status, and the age of the oldest due task.
pub(super) async fn stats(pool: &PgPool) -> Result<Stats> {
    let rows = sqlx::query(
        "SELECT command_type, status, COUNT(*) AS n FROM tenax_tasks
         GROUP BY command_type, status ORDER BY command_type, status",
    )
    .fetch_all(pool)
    .await
    .map_err(map_err)?;
    let mut stats = Stats::default();
    for row in &rows {
        let command_type: String = row.try_get("command_type").map_err(map_err)?;
        let status: String = row.try_get("status").map_err(map_err)?;
        let status: TaskStatus = status.parse()?;
        let n = u64::try_from(row.try_get::<i64, _>("n").map_err(map_err)?).unwrap_or(0);
        stats.by_type.push((command_type, status, n));
        match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
            Some((_, total)) => *total += n,
            None => stats.by_status.push((status, n)),
        }
    }
    stats.by_status.sort();
    let oldest_ms: Option<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM (now() - MIN(run_at)))::float8 * 1000 FROM tenax_tasks
         WHERE status IN ('pending', 'retrying') AND run_at <= now()",
    )
    .fetch_one(pool)
    .await
    .map_err(map_err)?;
    stats.oldest_due_age = oldest_ms.map(|ms| std::time::Duration::from_millis(ms.max(0.0) as u64));
    Ok(stats)
}
