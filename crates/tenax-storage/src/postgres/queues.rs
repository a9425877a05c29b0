//! Queue controls on PostgreSQL: list, pause, resume and limits (the claim side is in
//! `claim.rs`).
use sqlx::Row;

use super::{map_err, notify, PgStorage, NOW};
use crate::common::validate_queue_update;
use crate::error::{Result, StorageError};
use crate::params::{QueueChange, QueueInfo, QueueUpdateParams};

const INFO: &str =
    "SELECT n.name, COALESCE(q.paused, false) AS paused, q.max_running, q.updated_at,
        COALESCE(c.waiting, 0) AS waiting, COALESCE(c.running, 0) AS running
 FROM names n
 LEFT JOIN tenax_queues q ON q.name = n.name
 LEFT JOIN counts c ON c.queue = n.name
 ORDER BY n.name";

impl PgStorage {
    pub(super) async fn queue_list_impl(&self) -> Result<Vec<QueueInfo>> {
        let rows = sqlx::query(&format!(
            "WITH counts AS (
                 SELECT queue,
                        count(*) FILTER (WHERE status IN ('pending', 'retrying')) AS waiting,
                        count(*) FILTER (WHERE status = 'running') AS running
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
        let (paused, max_running) = match params.change {
            QueueChange::Pause => (Some(true), None),
            QueueChange::Resume => (Some(false), None),
            QueueChange::MaxRunning(max) => (None, Some(max)),
        };
        let mut tx = self.begin().await?;
        // One upsert: $3 NULL keeps `paused`; $4 false keeps `max_running`.
        sqlx::query(&format!(
            "INSERT INTO tenax_queues (name, paused, max_running, updated_at)
             VALUES ($2, COALESCE($3, false), CASE WHEN $4 THEN $5 END, {NOW})
             ON CONFLICT (name) DO UPDATE
             SET paused = COALESCE($3, tenax_queues.paused),
                 max_running = CASE WHEN $4 THEN $5 ELSE tenax_queues.max_running END,
                 updated_at = {NOW}"
        ))
        .bind(params.now)
        .bind(&params.queue)
        .bind(paused)
        .bind(max_running.is_some())
        .bind(
            max_running
                .flatten()
                .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        )
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let row = sqlx::query(&format!(
            "WITH counts AS (
                 SELECT queue,
                        count(*) FILTER (WHERE status IN ('pending', 'retrying')) AS waiting,
                        count(*) FILTER (WHERE status = 'running') AS running
                 FROM tenax_tasks WHERE queue = $1 AND status IN ('pending', 'retrying', 'running')
                 GROUP BY queue
             ), names AS (SELECT $1::text AS name)
             {INFO}"
        ))
        .bind(&params.queue)
        .fetch_one(&mut *tx)
        .await
        .map_err(map_err)?;
        let info = queue_from_row(&row)?;
        // Resumed or given more room: tell every node's workers.
        notify(&mut tx, &params.queue).await?;
        tx.commit().await.map_err(map_err)?;
        self.wake();
        Ok(info)
    }
}

fn queue_from_row(row: &sqlx::postgres::PgRow) -> Result<QueueInfo> {
    let count = |column: &str| -> Result<u64> {
        let n: i64 = row.try_get(column).map_err(map_err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    let max_running: Option<i32> = row.try_get("max_running").map_err(map_err)?;
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
        updated_at: row.try_get("updated_at").map_err(map_err)?,
    })
}
