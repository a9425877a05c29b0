//! A task's outcome on SQLite: completion (one task, or a batch in one transaction),
//! failure (retry, hand-back, cancel or death) and the reaper's expiry. Each runs in one
//! `BEGIN IMMEDIATE` transaction guarded by the lease (`status = 'running' AND
//! lease_epoch = ?`), closes the attempt, and hands the task as written to
//! [`crate::flow`] for what follows (compensation, workflow).
use std::collections::HashSet;

use sqlx::{Sqlite, Transaction};
use tenax_core::AttemptOutcome;

use super::rows::{ms, task_from_row, TASK_COLUMNS};
use super::{clock, map_err, SqliteStorage};
use crate::common::{duration_ms, json_list, truncate_error};
use crate::error::Result;
use crate::flow::{self, FailPlan};
use crate::params::{
    BatchCompletion, ReapedTask, TaskCompleteParams, TaskFailParams, TaskReapParams,
};
use crate::shared::outcomes::first_named;

crate::shared::outcomes::outcomes_statements!(clocked sqlx::Sqlite, crate::sqlite::SqliteStorage);

/// Complete one leased task inside `tx` at `now`, as
/// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased) does:
/// `None` (and nothing written) when the lease was lost, else whether tasks that depend
/// on it became due.
pub(super) async fn complete_in(
    tx: &mut Transaction<'static, Sqlite>,
    params: &TaskCompleteParams,
    now: i64,
) -> Result<Option<bool>> {
    let row = sqlx::query(&format!(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = ?1, finished_at = ?2, updated_at = ?2,
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = ?3 AND status = 'running' AND lease_epoch = ?4
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(params.result.as_deref())
    .bind(now)
    .bind(params.lease.id.0)
    .bind(params.lease.epoch)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let task = task_from_row(&row)?;
    close_attempt(tx, params.lease, AttemptOutcome::Succeeded, None, now).await?;
    let woke = flow::completed(&mut **tx, &task, params.compensation, ms(now)?).await?;
    Ok(Some(woke))
}

/// Complete, inside `tx`, the plain tasks among `items` (neither a workflow's task nor
/// a compensation) whose lease still holds, each at `at(item)`, and close their
/// attempts: two statements for the whole batch. Returns the leases that landed; the
/// other items are left untouched.
async fn complete_plain_in(
    tx: &mut Transaction<'static, Sqlite>,
    items: &[&TaskCompleteParams],
    at: impl Fn(&TaskCompleteParams) -> i64,
) -> Result<HashSet<(i64, i64)>> {
    if items.is_empty() {
        return Ok(HashSet::new());
    }
    // [[id, epoch, result, at], ...]: the result is JSON text, carried as a string.
    let batch = json_list(
        &items
            .iter()
            .map(|p| (p.lease.id.0, p.lease.epoch, p.result.as_deref(), at(p)))
            .collect::<Vec<_>>(),
    );
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = b.result, finished_at = b.at, updated_at = b.at,
             lease_owner = NULL, lease_expires_at = NULL
         FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS epoch,
                      json_extract(value, '$[2]') AS result, json_extract(value, '$[3]') AS at
               FROM json_each(?1)) AS b
         WHERE tenax_tasks.id = b.id AND tenax_tasks.lease_epoch = b.epoch
           AND tenax_tasks.status = 'running' AND tenax_tasks.kind = 'execute'
           AND tenax_tasks.workflow_id IS NULL
         RETURNING id, lease_epoch, finished_at",
    )
    .bind(&batch)
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    if !rows.is_empty() {
        sqlx::query(
            "UPDATE tenax_attempts
             SET finished_at = json_extract(d.value, '$[2]'), outcome = 'succeeded', error = NULL
             FROM json_each(?1) AS d
             WHERE tenax_attempts.task_id = json_extract(d.value, '$[0]')
               AND tenax_attempts.epoch = json_extract(d.value, '$[1]')
               AND tenax_attempts.outcome = 'running'",
        )
        .bind(json_list(&rows))
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
    }
    Ok(rows.into_iter().map(|(id, epoch, _)| (id, epoch)).collect())
}

impl SqliteStorage {
    pub(super) async fn complete_impl(&self, params: &TaskCompleteParams) -> Result<bool> {
        self.complete_once(params).await
    }

    pub(super) async fn fail_impl(&self, params: &TaskFailParams) -> Result<bool> {
        let error = truncate_error(&params.error);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let plan = FailPlan::of(params.next);
        // The rule of `FailPlan::status`, in SQL: asked to die, else cancelled when asked
        // or requested, else dead out of attempts (counted after a hand-back's refund),
        // else retrying.
        let status = "CASE WHEN ?1 THEN 'dead'
                           WHEN ?8 OR cancel_requested_at IS NOT NULL THEN 'cancelled'
                           WHEN attempt - ?7 >= max_attempts THEN 'dead'
                           ELSE 'retrying' END";
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = {status},
                 attempt = attempt - ?7,
                 run_at = ?2, last_error = ?3, updated_at = ?4,
                 lease_owner = NULL, lease_expires_at = NULL,
                 finished_at = CASE WHEN {status} != 'retrying' THEN ?4 END,
                 compensation = CASE WHEN {status} = 'dead' AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END
             WHERE id = ?5 AND status = 'running' AND lease_epoch = ?6
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(plan.die)
        .bind(now.saturating_add(duration_ms(plan.delay)))
        .bind(&error)
        .bind(now)
        .bind(params.lease.id.0)
        .bind(params.lease.epoch)
        .bind(i64::from(plan.refund))
        .bind(plan.cancel)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        let task = task_from_row(&row)?;
        let due_now = duration_ms(plan.delay) == 0;
        self.failed(tx, params.lease, &task, &error, now, due_now)
            .await
    }

    pub(super) async fn reap_impl(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let beyond = reap_beyond_at(&mut tx, params).await?;
        // The expiry is checked again in the UPDATE's own WHERE: the reaper never acts
        // on a row it read earlier, so a completion that commits first always wins.
        let rows = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                               WHEN attempt >= max_attempts THEN 'dead' ELSE 'retrying' END,
                 run_at = ?1,
                 last_error = 'lease expired: worker ' || COALESCE(lease_owner, '?') || ' stopped renewing it',
                 finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR attempt >= max_attempts
                                    THEN ?1 END,
                 compensation = CASE WHEN cancel_requested_at IS NULL AND attempt >= max_attempts
                                          AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END,
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = ?1
             WHERE id IN (SELECT id FROM tenax_tasks
                          WHERE status = 'running' AND (lease_expires_at < ?1 OR lease_expires_at > ?3)
                          ORDER BY lease_expires_at LIMIT ?2)
               AND status = 'running' AND (lease_expires_at < ?1 OR lease_expires_at > ?3)
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(i64::from(params.limit))
        .bind(beyond)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        self.reaped(tx, tasks, now).await
    }

    /// One batch (never empty, checked), with which items repeat an earlier lease.
    pub(super) async fn complete_many_impl(
        &self,
        params: &[TaskCompleteParams],
        repeated: &[bool],
    ) -> Result<Vec<BatchCompletion>> {
        // One `BEGIN IMMEDIATE` (one fsync) for the batch. The plain tasks take two
        // statements for the whole batch; a workflow task or a compensation, and a
        // lease that no longer holds, take the one-task path after them, in the same
        // transaction: the single writer holds no row another writer waits for.
        let mut tx = self.begin().await?;
        let db_now = clock(&mut tx, None).await?;
        let at = |item: &TaskCompleteParams| item.now.map_or(db_now, |at| at.timestamp_millis());
        let first = first_named(params, repeated);
        let plain = complete_plain_in(&mut tx, &first, at).await?;
        let mut landed = Vec::with_capacity(params.len());
        let mut woke = false;
        for (item, &repeated) in params.iter().zip(repeated) {
            if repeated {
                landed.push(BatchCompletion::Lost);
            } else if plain.contains(&(item.lease.id.0, item.lease.epoch)) {
                landed.push(BatchCompletion::Landed);
            } else if let Some(w) = complete_in(&mut tx, item, at(item)).await? {
                woke |= w;
                landed.push(BatchCompletion::Landed);
            } else {
                landed.push(BatchCompletion::Lost);
            }
        }
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(landed)
    }
}
