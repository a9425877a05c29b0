//! Operator actions on one task, on SQLite: cancel (a waiting task at once, a running
//! one by request), retry (a dead task, or a dead compensation), and prune.
use tenax_core::{TaskKind, TaskRecord, TaskStatus};

use super::rows::{ms, task_from_row, TASK_COLUMNS};
use super::{clock, fetch_ref, map_err, runtime, SqliteStorage};
use crate::common::{duration_ms, json_list, refusal, split_ref};
use crate::error::{Result, StorageError};
use crate::params::{TaskActionParams, TaskPruneParams};
use crate::{flow, redrive};

impl SqliteStorage {
    pub(super) async fn cancel_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let (by_id, by_no) = split_ref(&params.task);
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ?1, updated_at = ?1
             WHERE (id = ?2 OR task_no = ?3) AND status IN ('pending', 'retrying', 'blocked')
               AND kind = 'execute'
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(by_id)
        .bind(by_no)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        match row {
            Some(row) => {
                let task = task_from_row(&row)?;
                let woke = flow::after_finish(&mut *tx, &task, ms(now)?).await?;
                tx.commit().await.map_err(map_err)?;
                if woke {
                    self.wake();
                }
                Ok(task)
            }
            None => {
                let current = fetch_ref(&mut *tx, &params.task).await?;
                if let Some(task) = current
                    .as_ref()
                    .filter(|t| t.kind == TaskKind::Execute && t.status == TaskStatus::Running)
                {
                    if runtime::request_cancel(&mut tx, task.id, now).await? {
                        tx.commit().await.map_err(map_err)?;
                        return Ok(task.clone());
                    }
                }
                tx.rollback().await.map_err(map_err)?;
                if let Some(task) = current.as_ref().filter(|t| t.kind == TaskKind::Compensate) {
                    // The compensated task would wait for it forever.
                    return Err(StorageError::InvalidState {
                        task: params.task.to_string(),
                        status: task.status,
                        action: "cancel a compensation",
                    });
                }
                Err(refusal(&params.task, current, "cancel it"))
            }
        }
    }

    pub(super) async fn retry_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let current = fetch_ref(&mut *tx, &params.task).await?;
        let (task, woke) = redrive::retry(&mut *tx, &params.task, current, ms(now)?).await??;
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(task)
    }

    pub(super) async fn prune_impl(&self, params: &TaskPruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let ids: Vec<i64> = sqlx::query_scalar(
            "DELETE FROM tenax_tasks
             WHERE id IN (SELECT id FROM tenax_tasks
                          WHERE status IN ('succeeded', 'dead', 'cancelled')
                            AND finished_at < ?1
                            AND (compensation IS NULL OR compensation != 'pending')
                          ORDER BY finished_at LIMIT ?2)
             RETURNING id",
        )
        .bind(now.saturating_sub(duration_ms(params.retention)))
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if !ids.is_empty() {
            sqlx::query(
                "DELETE FROM tenax_attempts WHERE task_id IN (SELECT value FROM json_each(?))",
            )
            .bind(json_list(&ids))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(ids.len() as u64)
    }
}
