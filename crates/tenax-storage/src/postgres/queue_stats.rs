//! [`Storage::queue_stats`](crate::Storage::queue_stats) on PostgreSQL.
use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use tenax_core::TaskStatus;

use super::map_err;
use crate::error::Result;
use crate::params::QueueStats;
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
