//! [`Storage::queue_stats`](crate::Storage::queue_stats) on SQLite.
use chrono::{DateTime, Utc};
use sqlx::{Row, SqlitePool};
use tenax_core::TaskStatus;

use super::{map_err, NOW_MS};
use crate::error::Result;
use crate::params::QueueStats;
use crate::queue_stats::{age_from_ms, fold, QueueStatusRow};

/// Counts by queue and status, with each queue's backlog and oldest due age: one
/// read-only statement (times are integer milliseconds).
pub(super) async fn queue_stats(
    pool: &SqlitePool,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<QueueStats>> {
    let mut conn = pool.acquire().await.map_err(map_err)?;
    let now: i64 = match now {
        Some(now) => now.timestamp_millis(),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?,
    };
    let rows = sqlx::query(
        "SELECT queue, status, COUNT(*) AS n,
                SUM(CASE WHEN run_at <= ?1 THEN 1 ELSE 0 END) AS due,
                ?1 - MIN(CASE WHEN run_at <= ?1 THEN run_at END) AS oldest_ms
         FROM tenax_tasks GROUP BY queue, status",
    )
    .bind(now)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let status: String = row.try_get("status").map_err(map_err)?;
        let count: i64 = row.try_get("n").map_err(map_err)?;
        let due: i64 = row.try_get("due").map_err(map_err)?;
        let oldest_ms: Option<i64> = row.try_get("oldest_ms").map_err(map_err)?;
        out.push(QueueStatusRow {
            queue: row.try_get("queue").map_err(map_err)?,
            status: status.parse::<TaskStatus>()?,
            count: u64::try_from(count).unwrap_or(0),
            due: u64::try_from(due).unwrap_or(0),
            oldest_due_age: oldest_ms.map(|ms| age_from_ms(ms as f64)),
        });
    }
    Ok(fold(out))
}
