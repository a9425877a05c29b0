//! Queue controls on MariaDB/MySQL: list, pause, resume and limits (the claim side is in
//! `claim.rs`).
use sqlx::Row;

use super::rows::text;
use super::{clock, map_err, retrying, MySqlStorage};
use crate::common::validate_queue_update;
use crate::error::{Result, StorageError};
use crate::params::{QueueChange, QueueInfo, QueueUpdateParams};

const INFO: &str =
    "SELECT n.name, COALESCE(q.paused, FALSE) AS paused, q.max_running, q.updated_at,
        CAST(COALESCE(c.waiting, 0) AS SIGNED) AS waiting,
        CAST(COALESCE(c.running, 0) AS SIGNED) AS running
 FROM names n
 LEFT JOIN tenax_queues q ON q.name = n.name
 LEFT JOIN counts c ON c.queue = n.name
 ORDER BY n.name";

impl MySqlStorage {
    pub(super) async fn queue_list_impl(&self) -> Result<Vec<QueueInfo>> {
        let rows = sqlx::query(&format!(
            "WITH counts AS (
                 SELECT queue,
                        SUM(status IN ('pending', 'retrying')) AS waiting,
                        SUM(status = 'running') AS running
                 FROM tenax_tasks WHERE status IN ('pending', 'retrying', 'running')
                 GROUP BY queue
             ), names AS (
                 SELECT queue AS name FROM counts UNION SELECT name FROM tenax_queues
             )
             {INFO}"
        ))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        rows.iter().map(queue_from_row).collect()
    }

    pub(super) async fn queue_update_impl(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        validate_queue_update(params)?;
        let info = retrying(|| self.queue_update_once(params)).await?;
        self.wake();
        Ok(info)
    }

    async fn queue_update_once(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let (paused, set_max, max) = match params.change {
            QueueChange::Pause => (Some(true), false, None),
            QueueChange::Resume => (Some(false), false, None),
            QueueChange::MaxRunning(max) => (None, true, max),
        };
        let max = max.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
        sqlx::query(
            "INSERT INTO tenax_queues (name, paused, max_running, updated_at)
             VALUES (?, COALESCE(?, FALSE), IF(?, ?, NULL), ?)
             ON DUPLICATE KEY UPDATE
                 paused = COALESCE(?, paused),
                 max_running = IF(?, ?, max_running),
                 updated_at = VALUES(updated_at)",
        )
        .bind(params.queue.as_str())
        .bind(paused)
        .bind(set_max)
        .bind(max)
        .bind(now)
        .bind(paused)
        .bind(set_max)
        .bind(max)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let row = sqlx::query(&format!(
            "WITH counts AS (
                 SELECT queue,
                        SUM(status IN ('pending', 'retrying')) AS waiting,
                        SUM(status = 'running') AS running
                 FROM tenax_tasks WHERE queue = ? AND status IN ('pending', 'retrying', 'running')
                 GROUP BY queue
             ), names AS (SELECT name FROM tenax_queues WHERE name = ?)
             {INFO}"
        ))
        .bind(params.queue.as_str())
        .bind(params.queue.as_str())
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let info = queue_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        Ok(info)
    }
}

fn queue_from_row(row: &sqlx::mysql::MySqlRow) -> Result<QueueInfo> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(map_err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let max_running: Option<i32> = row.try_get("max_running").map_err(map_err)?;
    let updated_at: Option<chrono::NaiveDateTime> = row.try_get("updated_at").map_err(map_err)?;
    Ok(QueueInfo {
        name: text(row, "name")?,
        paused: row.try_get("paused").map_err(map_err)?,
        max_running: max_running
            .map(|n| {
                u32::try_from(n).map_err(|_| StorageError::Corrupt(format!("max_running = {n}")))
            })
            .transpose()?,
        waiting: count("waiting")?,
        running: count("running")?,
        updated_at: updated_at.map(|t| t.and_utc()),
    })
}
