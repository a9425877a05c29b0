//! Operator actions on one task, on PostgreSQL: cancel (a waiting task at once, a running
//! one by request), retry (a dead task, or a dead compensation), and prune.
use tenax_core::{TaskKind, TaskRecord, TaskStatus};

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{clock, fetch_ref, map_err, runtime, written_at, PgStorage, NOW};
use crate::common::{duration_ms, refusal, split_ref};
use crate::error::{Result, StorageError};
use crate::params::{TaskActionParams, TaskPruneParams};
use crate::{flow, redrive};

impl PgStorage {
    pub(super) async fn cancel_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let (by_id, by_no) = split_ref(&params.task);
        self.timed(async {
            let mut tx = self.begin().await?;
            let row = sqlx::query(&format!(
                "UPDATE tenax_tasks SET status = 'cancelled', finished_at = {NOW}, updated_at = {NOW}
                 WHERE (id = $2 OR task_no = $3) AND status IN ('pending', 'retrying', 'blocked')
                   AND kind = 'execute'
                 RETURNING {TASK_COLUMNS}"
            ))
            .bind(params.now)
            .bind(by_id)
            .bind(by_no)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
            if let Some(row) = row {
                let task = task_from_row(&row)?;
                let woke = flow::after_finish(&mut *tx, &task, written_at(&task)).await?;
                tx.commit().await.map_err(map_err)?;
                if woke {
                    self.wake();
                }
                return Ok(task);
            }
            let current = fetch_ref(&mut *tx, &params.task).await?;
            if let Some(task) = current.as_ref().filter(|t| {
                t.kind == TaskKind::Execute && t.status == TaskStatus::Running
            }) {
                if runtime::request_cancel(&mut tx, params.now, task.id).await? {
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
        })
        .await
    }

    pub(super) async fn retry_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        self.timed(async {
            let mut tx = self.begin().await?;
            let now = clock(&mut tx, params.now).await?;
            let current = fetch_ref(&mut *tx, &params.task).await?;
            let (task, woke) = redrive::retry(&mut *tx, &params.task, current, now).await??;
            tx.commit().await.map_err(map_err)?;
            if woke {
                self.wake();
            }
            Ok(task)
        })
        .await
    }

    pub(super) async fn prune_impl(&self, params: &TaskPruneParams) -> Result<u64> {
        self.timed(async {
            let deleted: i64 = sqlx::query_scalar(&format!(
                "WITH gone AS (
                     DELETE FROM tenax_tasks
                     WHERE id IN (SELECT id FROM tenax_tasks
                                  WHERE status IN ('succeeded', 'dead', 'cancelled')
                                    AND finished_at < {NOW} - $2::float8 * interval '1 millisecond'
                                    AND (compensation IS NULL OR compensation != 'pending')
                                  ORDER BY finished_at LIMIT $3
                                  FOR UPDATE SKIP LOCKED)
                     RETURNING id
                 ), history AS (
                     DELETE FROM tenax_attempts WHERE task_id IN (SELECT id FROM gone)
                 )
                 SELECT COUNT(*) FROM gone"
            ))
            .bind(params.now)
            .bind(duration_ms(params.retention) as f64)
            .bind(i64::from(params.limit))
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
            Ok(u64::try_from(deleted).unwrap_or(0))
        })
        .await
    }
}
