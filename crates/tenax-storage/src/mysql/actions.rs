//! Operator actions on one task, on MariaDB/MySQL: cancel (a waiting task at once, a
//! running one by request), retry (a dead task, or a dead compensation; written once in
//! `crate::shared::actions`), and prune. One attempt each: `retrying` runs them again
//! after a lock conflict.
use sqlx::{QueryBuilder, Row};
use tenax_core::{TaskKind, TaskRecord, TaskStatus};

use super::{
    clock, fetch_id, fetch_ref_for_update, map_err, minus, push_list, runtime, MySqlStorage,
    FINISHED,
};
use crate::error::Result;
use crate::flow;
use crate::params::{TaskActionParams, TaskPruneParams};
use crate::shared::actions::cancel_refused;

// retry_impl: the task locked first.
crate::shared::actions::action_statements!(
    crate::mysql::MySqlStorage, sqlx::MySql,
    read(tx, task) = fetch_ref_for_update(&mut **tx, task), retry: retry_impl
);

impl MySqlStorage {
    pub(super) async fn cancel_impl(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let current = fetch_ref_for_update(&mut *tx, &params.task).await?;
        if let Some(task) = current
            .as_ref()
            .filter(|t| t.kind == TaskKind::Execute && t.status == TaskStatus::Running)
        {
            if runtime::request_cancel(&mut tx, task.id, now).await? {
                tx.commit().await.map_err(map_err)?;
                return Ok(task.clone());
            }
        }
        let Some(task) = current.clone().filter(|t| {
            t.kind == TaskKind::Execute
                && matches!(
                    t.status,
                    TaskStatus::Pending | TaskStatus::Retrying | TaskStatus::Blocked
                )
        }) else {
            tx.rollback().await.map_err(map_err)?;
            return Err(cancel_refused(&params.task, current));
        };
        sqlx::query(
            "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ?, updated_at = ?
             WHERE id = ? AND status IN ('pending', 'retrying', 'blocked') AND kind = 'execute'",
        )
        .bind(now)
        .bind(now)
        .bind(task.id.0)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let task = fetch_id(&mut tx, task.id).await?;
        let woke = flow::after_finish(&mut *tx, &task, now.and_utc()).await?;
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(task)
    }

    pub(super) async fn prune_once(&self, params: &TaskPruneParams) -> Result<u64> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        // SKIP LOCKED: a finished task another transaction is changing (a retry, a
        // compensation's outcome) is left for the next prune. One branch per status,
        // for the reason the claim has them: each walks the pruner index in order and
        // stops after `limit` rows instead of locking every prunable row for a sort.
        let before = minus(now, params.retention);
        let limit = i64::from(params.limit);
        let mut qb = QueryBuilder::new("");
        for (n, status) in FINISHED.iter().enumerate() {
            if n > 0 {
                qb.push(" UNION ALL ");
            }
            // `status` is one of the FINISHED constants, not input.
            qb.push(format!(
                "(SELECT id, finished_at FROM tenax_tasks WHERE status = '{status}'
                    AND (compensation IS NULL OR compensation <> 'pending')
                    AND finished_at < "
            ));
            qb.push_bind(before);
            qb.push(" ORDER BY finished_at LIMIT ");
            qb.push_bind(limit);
            qb.push(" FOR UPDATE SKIP LOCKED)");
        }
        qb.push(" ORDER BY finished_at LIMIT ");
        qb.push_bind(limit);
        let ids = qb
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?
            .iter()
            .map(|row| row.try_get::<i64, _>("id").map_err(map_err))
            .collect::<Result<Vec<_>>>()?;
        if ids.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(0);
        }
        let mut qb = QueryBuilder::new("DELETE FROM tenax_tasks WHERE id IN ");
        push_list(&mut qb, ids.iter().copied());
        let deleted = qb.build().execute(&mut *tx).await.map_err(map_err)?;
        let mut qb = QueryBuilder::new("DELETE FROM tenax_attempts WHERE task_id IN ");
        push_list(&mut qb, ids.iter().copied());
        qb.build().execute(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(deleted.rows_affected())
    }
}
