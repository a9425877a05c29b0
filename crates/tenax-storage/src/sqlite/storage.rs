//! The [`Storage`](crate::Storage) trait on SQLite: each method forwards to the file of
//! this folder that holds its statements (`claim.rs`, `outcomes.rs`, `actions.rs`, ...),
//! or, for a workflow, to the logic written once in `crate::flow`.
#[allow(clippy::wildcard_imports)]
use super::*;

crate::shared::storage::storage_impl!(SqliteStorage, sqlx::Sqlite, "sqlite", {
    async fn migrate(&self) -> Result<()> {
        // Two processes starting on a fresh file may race; the loser sees the winner's
        // migrations on its next try.
        let mut last = None;
        for _ in 0..5 {
            match migrator().run(&self.pool).await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        Err(StorageError::Migration(
            last.map(|e| e.to_string()).unwrap_or_default(),
        ))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let now: i64 = sqlx::query_scalar(NOW_MS)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        ms(now)
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE (?1 IS NULL OR status = ?1)
               AND (?2 IS NULL OR command_type = ?2)
               AND (?3 IS NULL OR queue = ?3)
               AND (?4 IS NULL OR id < ?4)
               AND (?6 IS NULL OR started_at < ?6)
               AND (?7 IS NULL OR created_at >= ?7)
               AND (?8 IS NULL OR created_at < ?8)
             ORDER BY id DESC
             LIMIT ?5"
        ))
        .bind(params.status.map(TaskStatus::as_str))
        .bind(params.command_type.as_deref())
        .bind(params.queue.as_deref())
        .bind(params.before_id.map(|id| id.0))
        .bind(i64::from(params.limit))
        .bind(params.started_before.map(|t| t.timestamp_millis()))
        .bind(params.created_after.map(|t| t.timestamp_millis()))
        .bind(params.created_before.map(|t| t.timestamp_millis()))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        let pairs = json_list(
            &params
                .leases
                .iter()
                .map(|l| [l.id.0, l.epoch])
                .collect::<Vec<_>>(),
        );
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let renewed: Vec<(i64, i64)> = sqlx::query_as(
            "UPDATE tenax_tasks SET lease_expires_at = ?1 + ?2, updated_at = ?1
             WHERE status = 'running'
               AND (id, lease_epoch) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                                         FROM json_each(?3))
             RETURNING id, lease_epoch",
        )
        .bind(now)
        .bind(duration_ms(params.lease_ttl))
        .bind(pairs)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(renewed
            .into_iter()
            .map(|(id, epoch)| Lease {
                id: TaskId(id),
                epoch,
            })
            .collect())
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.pool, params).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // The status list repeats the finished-task index's condition, so SQLite uses it.
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead', 'cancelled') AND status <> 'cancelled'
               AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(params.since.timestamp_millis())
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }
});
