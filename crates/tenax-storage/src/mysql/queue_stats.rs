//! [`Storage::queue_stats`](crate::Storage::queue_stats) on MariaDB/MySQL.
use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::{MySqlPool, Row};
use tenax_core::TaskStatus;

use super::{map_err, storable};
use crate::error::{Result, StorageError};
use crate::params::QueueStats;
use crate::queue_stats::{fold, QueueStatusRow};

/// Counts by queue and status, with each queue's backlog and oldest due age: one
/// read-only statement on the database clock (or the override).
pub(super) async fn queue_stats(
    pool: &MySqlPool,
    now: Option<DateTime<Utc>>,
) -> Result<Vec<QueueStats>> {
    let mut conn = pool.acquire().await.map_err(map_err)?;
    let now: NaiveDateTime = match now {
        Some(now) => storable(now),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?,
    };
    let rows = sqlx::query(
        "SELECT queue, status, COUNT(*) AS n,
                CAST(SUM(CASE WHEN run_at <= ? THEN 1 ELSE 0 END) AS SIGNED) AS due,
                MIN(CASE WHEN run_at <= ? THEN run_at END) AS oldest
         FROM tenax_tasks GROUP BY queue, status",
    )
    .bind(now)
    .bind(now)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let text = |row: &sqlx::mysql::MySqlRow, column: &str| -> Result<String> {
        let bytes: Vec<u8> = row.try_get(column).map_err(map_err)?;
        String::from_utf8(bytes)
            .map_err(|_| StorageError::Corrupt(format!("{column} is not UTF-8")))
    };
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        let count: i64 = row.try_get("n").map_err(map_err)?;
        let due: Option<i64> = row.try_get("due").map_err(map_err)?;
        let oldest: Option<NaiveDateTime> = row.try_get("oldest").map_err(map_err)?;
        out.push(QueueStatusRow {
            queue: text(row, "queue")?,
            status: text(row, "status")?.parse::<TaskStatus>()?,
            count: u64::try_from(count).unwrap_or(0),
            due: due.and_then(|d| u64::try_from(d).ok()).unwrap_or(0),
            oldest_due_age: oldest.map(|oldest| (now - oldest).to_std().unwrap_or_default()),
        });
    }
    Ok(fold(out))
}
