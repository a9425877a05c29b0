//! A task's outcome on MariaDB/MySQL: completion (one task, or a batch in one
//! transaction), failure (retry, hand-back, cancel or death) and the reaper's expiry.
//! Each locks the leased row first (`FOR UPDATE`; the reaper `SKIP LOCKED`), writes it
//! by primary key with the lease's conditions repeated, closes the attempt, and hands
//! the task as written to [`crate::flow`] for what follows (compensation, workflow).
//! One attempt each: `retrying` runs them again after a lock conflict.
use sqlx::{MySql, QueryBuilder, Transaction};
use tenax_core::{AttemptOutcome, CompensationState, TaskKind, TaskRecord, TaskStatus};

use super::{
    clock, fetch_id, fetch_ids, fetch_ref_for_update, map_err, plus, push_list, runtime, storable,
    DbTime, MySqlStorage,
};
use crate::common::duration_ms;
use crate::error::{Result, StorageError};
use crate::flow::{self, FailPlan};
use crate::params::{
    BatchCompletion, Lease, ReapedTask, TaskCompleteParams, TaskFailParams, TaskReapParams, TaskRef,
};
use crate::shared::outcomes::verdicts;

crate::shared::outcomes::outcomes_statements!(clocked sqlx::MySql, crate::mysql::MySqlStorage);

/// Complete one leased task inside `tx` at `now`, as
/// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased) does:
/// `None` (and nothing written) when the lease was lost, else whether tasks that depend
/// on it became due.
pub(super) async fn complete_in(
    tx: &mut Transaction<'static, MySql>,
    params: &TaskCompleteParams,
    now: DbTime,
) -> Result<Option<bool>> {
    let Some(task) = lock_leased(tx, params.lease).await? else {
        return Ok(None);
    };
    let done = sqlx::query(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = ?, finished_at = ?, updated_at = ?,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ? AND status = 'running' AND lease_epoch = ?",
    )
    .bind(params.result.as_deref())
    .bind(now)
    .bind(now)
    .bind(params.lease.id.0)
    .bind(params.lease.epoch)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if done.rows_affected() != 1 {
        return Ok(None);
    }
    close_attempt(tx, params.lease, AttemptOutcome::Succeeded, None, now).await?;
    let mut done = task;
    done.status = TaskStatus::Succeeded;
    let woke = flow::completed(&mut **tx, &done, params.compensation, now.and_utc()).await?;
    Ok(Some(woke))
}

/// Lock the task a lease names; `None` when it is no longer `running` under that epoch.
pub(super) async fn lock_leased(
    tx: &mut Transaction<'static, MySql>,
    lease: Lease,
) -> Result<Option<TaskRecord>> {
    let task = fetch_ref_for_update(&mut **tx, &TaskRef::Id(lease.id)).await?;
    Ok(task.filter(|t| t.status == TaskStatus::Running && t.lease_epoch == lease.epoch))
}

impl MySqlStorage {
    /// One attempt at
    /// [`Storage::task_complete_many_if_leased`](crate::Storage::task_complete_many_if_leased):
    /// lock the batch's running tasks in one statement, complete the plain ones (no
    /// workflow, not a compensation) with one multi-row `UPDATE` of the tasks and one of
    /// their attempts, in one transaction; the others are left alone.
    pub(super) async fn complete_many_impl(
        &self,
        params: &[TaskCompleteParams],
        repeated: &[bool],
    ) -> Result<Vec<BatchCompletion>> {
        let mut tx = self.begin().await?;
        let db_now = clock(&mut tx, None).await?;
        let mut qb = QueryBuilder::new(
            "SELECT id, lease_epoch,
                    CAST(kind = 'execute' AND workflow_id IS NULL AS SIGNED) AS plain
             FROM tenax_tasks WHERE status = 'running' AND id IN ",
        );
        push_list(&mut qb, params.iter().map(|p| p.lease.id.0));
        qb.push(" ORDER BY id FOR UPDATE");
        let locked: Vec<(i64, i64, i64)> = qb
            .build_query_as()
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
        let plain_leases: std::collections::HashSet<(i64, i64)> = locked
            .iter()
            .filter(|(_, _, plain)| *plain == 1)
            .map(|(id, epoch, _)| (*id, *epoch))
            .collect();
        let held: std::collections::HashSet<(i64, i64)> = locked
            .into_iter()
            .map(|(id, epoch, _)| (id, epoch))
            .collect();
        let plain: Vec<(&TaskCompleteParams, DbTime)> = params
            .iter()
            .zip(repeated)
            .filter(|(p, repeated)| {
                !**repeated && plain_leases.contains(&(p.lease.id.0, p.lease.epoch))
            })
            .map(|(p, _)| (p, p.now.map_or(db_now, storable)))
            .collect();
        if !plain.is_empty() {
            let mut qb =
                QueryBuilder::new("UPDATE tenax_tasks SET status = 'succeeded', result = CASE id");
            for (p, _) in &plain {
                qb.push(" WHEN ").push_bind(p.lease.id.0);
                qb.push(" THEN ").push_bind(p.result.as_deref());
            }
            for column in ["finished_at", "updated_at"] {
                qb.push(format!(" END, {column} = CASE id"));
                for (p, now) in &plain {
                    qb.push(" WHEN ").push_bind(p.lease.id.0);
                    qb.push(" THEN ").push_bind(*now);
                }
            }
            qb.push(" END, lease_owner = NULL, lease_expires_at = NULL");
            qb.push(" WHERE status = 'running' AND id IN ");
            push_list(&mut qb, plain.iter().map(|(p, _)| p.lease.id.0));
            qb.push(" AND lease_epoch = CASE id");
            for (p, _) in &plain {
                qb.push(" WHEN ").push_bind(p.lease.id.0);
                qb.push(" THEN ").push_bind(p.lease.epoch);
            }
            qb.push(" END");
            let done = qb.build().execute(&mut *tx).await.map_err(map_err)?;
            if done.rows_affected() != plain.len() as u64 {
                // The rows are locked under these epochs: this cannot happen.
                return Err(StorageError::Database(
                    format!(
                        "completed {} of {} locked tasks",
                        done.rows_affected(),
                        plain.len()
                    )
                    .into(),
                ));
            }
            let mut qb = QueryBuilder::new(
                "UPDATE tenax_attempts SET outcome = 'succeeded', error = NULL, finished_at = CASE task_id",
            );
            for (p, now) in &plain {
                qb.push(" WHEN ").push_bind(p.lease.id.0);
                qb.push(" THEN ").push_bind(*now);
            }
            qb.push(" END WHERE outcome = 'running' AND task_id IN ");
            push_list(&mut qb, plain.iter().map(|(p, _)| p.lease.id.0));
            qb.push(" AND epoch = CASE task_id");
            for (p, _) in &plain {
                qb.push(" WHEN ").push_bind(p.lease.id.0);
                qb.push(" THEN ").push_bind(p.lease.epoch);
            }
            qb.push(" END");
            qb.build().execute(&mut *tx).await.map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(verdicts(params, repeated, &plain_leases, &held))
    }

    pub(super) async fn fail_once(&self, params: &TaskFailParams, error: &str) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let Some(task) = lock_leased(&mut tx, params.lease).await? else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        let plan = FailPlan::of(params.next);
        // Decided from the locked row, not in SQL: MySQL evaluates SET assignments left
        // to right, each seeing the previous ones' new values.
        let requested = plan.cancel || runtime::cancel_is_requested(&mut tx, task.id).await?;
        let attempt = plan.attempt_after(task.attempt);
        let status = plan.status(attempt, task.max_attempts, requested);
        let dead = status == TaskStatus::Dead;
        let finished_at = status.is_finished().then_some(now);
        let compensation = if dead && task.kind == TaskKind::Execute {
            Some(CompensationState::Pending)
        } else {
            task.compensation
        };
        let done = sqlx::query(
            "UPDATE tenax_tasks
             SET status = ?, attempt = ?, run_at = ?, last_error = ?, updated_at = ?,
                 lease_owner = NULL, lease_expires_at = NULL, finished_at = ?, compensation = ?
             WHERE id = ? AND status = 'running' AND lease_epoch = ?",
        )
        .bind(status.as_str())
        .bind(i64::from(attempt))
        .bind(plus(now, plan.delay))
        .bind(error)
        .bind(now)
        .bind(finished_at)
        .bind(compensation.map(CompensationState::as_str))
        .bind(params.lease.id.0)
        .bind(params.lease.epoch)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if done.rows_affected() != 1 {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        // A finished task is read back for what follows it; a retry moves nothing.
        let task = if status.is_finished() {
            fetch_id(&mut tx, task.id).await?
        } else {
            TaskRecord { status, ..task }
        };
        let due_now = duration_ms(plan.delay) == 0;
        self.failed(tx, params.lease, &task, error, now, due_now)
            .await
    }

    pub(super) async fn reap_once(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let beyond = reap_beyond_at(&mut tx, params).await?;
        // SKIP LOCKED: a task whose worker is writing its outcome right now is left to
        // that worker.
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM tenax_tasks
             WHERE status = 'running' AND (lease_expires_at < ? OR lease_expires_at > ?)
             ORDER BY lease_expires_at LIMIT ?
             FOR UPDATE SKIP LOCKED",
        )
        .bind(now)
        .bind(beyond)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        if ids.is_empty() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        // The expiry is checked again in the UPDATE's own WHERE: the reaper never acts
        // on a row it read earlier, so a completion that commits first always wins.
        // MySQL assigns left to right, each assignment seeing the previous ones: the
        // error names the owner before the owner is cleared, `finished_at` and
        // `compensation` read the new status, and `attempt` is not assigned at all.
        let mut qb = QueryBuilder::new(
            "UPDATE tenax_tasks
             SET last_error = CONCAT('lease expired: worker ', COALESCE(lease_owner, '?'),
                                     ' stopped renewing it'),
                 status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                               WHEN attempt >= max_attempts THEN 'dead' ELSE 'retrying' END,
                 finished_at = CASE WHEN status <> 'retrying' THEN ",
        );
        qb.push_bind(now);
        qb.push(
            " END,
                 compensation = CASE WHEN status = 'dead' AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END,
                 lease_owner = NULL, lease_expires_at = NULL, run_at = ",
        );
        qb.push_bind(now);
        qb.push(", updated_at = ");
        qb.push_bind(now);
        qb.push(" WHERE status = 'running' AND (lease_expires_at < ");
        qb.push_bind(now);
        qb.push(" OR lease_expires_at > ");
        qb.push_bind(beyond);
        qb.push(") AND id IN ");
        push_list(&mut qb, ids.iter().copied());
        qb.build().execute(&mut *tx).await.map_err(map_err)?;
        let tasks: Vec<TaskRecord> = fetch_ids(&mut tx, &ids)
            .await?
            .into_iter()
            .filter(|t| {
                matches!(
                    t.status,
                    TaskStatus::Retrying | TaskStatus::Dead | TaskStatus::Cancelled
                )
            })
            .collect();
        self.reaped(tx, tasks, now).await
    }
}
