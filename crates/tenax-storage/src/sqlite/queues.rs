//! Queue controls on SQLite: list, pause, resume and per-queue limits on running tasks
//! (the claim side is in `claim.rs`).
use sqlx::Row;

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
use crate::common::validate_queue_update;
use crate::error::{Result, StorageError};
use crate::params::{QueueChange, QueueInfo, QueueUpdateParams};

impl SqliteStorage {
    pub(super) async fn queue_list_impl(&self) -> Result<Vec<QueueInfo>> {
        let rows = sqlx::query(
            "WITH counts AS (
                 SELECT queue,
                        SUM(status IN ('pending', 'retrying')) AS waiting,
                        SUM(status = 'running') AS running
                 FROM tenax_tasks WHERE status IN ('pending', 'retrying', 'running')
                 GROUP BY queue
             ), names AS (
                 SELECT queue AS name FROM counts UNION SELECT name FROM tenax_queues
             )
             SELECT n.name, COALESCE(q.paused, 0) AS paused, q.max_running, q.updated_at,
                    COALESCE(c.waiting, 0) AS waiting, COALESCE(c.running, 0) AS running
             FROM names n
             LEFT JOIN tenax_queues q ON q.name = n.name
             LEFT JOIN counts c ON c.queue = n.name
             ORDER BY n.name",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(queue_from_row).collect()
    }

    pub(super) async fn queue_update_impl(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        validate_queue_update(params)?;
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        sqlx::query(
            "INSERT INTO tenax_queues (name, paused, max_running, updated_at) VALUES (?1, 0, NULL, ?2)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&params.queue)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        // ?3 is the new `paused` (NULL keeps it), ?4 whether to set `max_running` to ?5.
        let (paused, set_max, max) = match params.change {
            QueueChange::Pause => (Some(true), false, None),
            QueueChange::Resume => (Some(false), false, None),
            QueueChange::MaxRunning(max) => (None, true, max),
        };
        sqlx::query(
            "UPDATE tenax_queues
             SET paused = COALESCE(?3, paused),
                 max_running = CASE WHEN ?4 THEN ?5 ELSE max_running END,
                 updated_at = ?2
             WHERE name = ?1",
        )
        .bind(&params.queue)
        .bind(now)
        .bind(paused)
        .bind(set_max)
        .bind(max.map(i64::from))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let row = sqlx::query(
            "SELECT q.name, q.paused, q.max_running, q.updated_at,
                    (SELECT COUNT(*) FROM tenax_tasks
                     WHERE queue = q.name AND status IN ('pending', 'retrying')) AS waiting,
                    (SELECT COUNT(*) FROM tenax_tasks
                     WHERE queue = q.name AND status = 'running') AS running
             FROM tenax_queues q WHERE q.name = ?1",
        )
        .bind(&params.queue)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let info = queue_from_row(&row)?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(info)
    }
}

fn queue_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<QueueInfo> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(map_err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let max_running: Option<i64> = row.try_get("max_running").map_err(map_err)?;
    let updated_at: Option<i64> = row.try_get("updated_at").map_err(map_err)?;
    Ok(QueueInfo {
        name: row.try_get("name").map_err(map_err)?,
        paused: row.try_get("paused").map_err(map_err)?,
        max_running: max_running
            .map(|n| {
                u32::try_from(n).map_err(|_| StorageError::Corrupt(format!("max_running = {n}")))
            })
            .transpose()?,
        waiting: count("waiting")?,
        running: count("running")?,
        updated_at: updated_at.map(ms).transpose()?,
    })
}
