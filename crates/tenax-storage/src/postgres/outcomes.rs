//! A task's outcome on PostgreSQL: completion (one task, or a batch in one transaction),
//! failure (retry, hand-back, cancel or death) and the reaper's expiry. Each is guarded
//! by the lease (`status = 'running' AND lease_epoch = $n`), closes the attempt, and
//! hands the task as written to [`crate::flow`] for what follows (compensation,
//! workflow), at the time its statement wrote (`written_at`).
use std::collections::HashSet;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tenax_core::{AttemptOutcome, TaskKind};

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, written_at, PgStorage, NOW};
use crate::common::{duration_ms, truncate_error};
use crate::error::Result;
use crate::flow::{self, FailPlan};
use crate::params::{
    BatchCompletion, ReapedTask, TaskCompleteParams, TaskFailParams, TaskReapParams,
};
use crate::shared::outcomes::{first_named, verdicts, Stamp};

crate::shared::outcomes::outcomes_statements!(sqlx::Postgres, crate::postgres::PgStorage);

/// PostgreSQL's statements write the caller's override, else the transaction's start
/// (`now()`), inline: no round trip reads the clock.
impl Stamp for Postgres {
    type At = Option<DateTime<Utc>>;
    const AT: &'static str = "COALESCE(?::timestamptz, now())";
    async fn at(_: &mut PgConnection, now: Option<DateTime<Utc>>) -> Result<Self::At> {
        Ok(now)
    }
}

/// Complete one leased task inside `tx`, as
/// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased) does:
/// `None` (and nothing written) when the lease was lost, else whether tasks that depend
/// on it became due.
pub(super) async fn complete_in(
    tx: &mut Transaction<'static, Postgres>,
    params: &TaskCompleteParams,
) -> Result<Option<bool>> {
    let row = sqlx::query(&format!(
        "UPDATE tenax_tasks
         SET status = 'succeeded', result = $2, finished_at = {NOW}, updated_at = {NOW},
             lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $3 AND status = 'running' AND lease_epoch = $4
         RETURNING {TASK_COLUMNS}, workflow_id"
    ))
    .bind(params.now)
    .bind(params.result.as_deref())
    .bind(params.lease.id.0)
    .bind(params.lease.epoch)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let task = task_from_row(&row)?;
    let workflow: Option<i64> = row.try_get("workflow_id").map_err(map_err)?;
    close_attempt(
        tx,
        params.lease,
        AttemptOutcome::Succeeded,
        None,
        params.now,
    )
    .await?;
    // Only a workflow's tasks (and compensations, which may belong to a saga) move
    // other tasks.
    let woke = if workflow.is_some() || task.kind == TaskKind::Compensate {
        flow::completed(&mut **tx, &task, params.compensation, written_at(&task)).await?
    } else {
        false
    };
    Ok(Some(woke))
}

/// Complete, in one statement, the items of a batch whose task is a plain one (no
/// workflow, not a compensation) still `running` under the item's epoch, closing
/// their attempt-history entries in the same statement; returns the ids that landed.
/// Other items are left untouched.
async fn complete_plain_in(
    tx: &mut Transaction<'static, Postgres>,
    items: &[&TaskCompleteParams],
) -> Result<Vec<(i64, i64)>> {
    let ids: Vec<i64> = items.iter().map(|p| p.lease.id.0).collect();
    let epochs: Vec<i64> = items.iter().map(|p| p.lease.epoch).collect();
    let results: Vec<Option<&str>> = items.iter().map(|p| p.result.as_deref()).collect();
    let nows: Vec<Option<DateTime<Utc>>> = items.iter().map(|p| p.now).collect();
    sqlx::query_as(
        "WITH b AS (
             SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::timestamptz[])
                 AS b(id, epoch, result, at)
         ), done AS (
             UPDATE tenax_tasks t
             SET status = 'succeeded', result = b.result,
                 finished_at = COALESCE(b.at, now()), updated_at = COALESCE(b.at, now()),
                 lease_owner = NULL, lease_expires_at = NULL
             FROM b
             WHERE t.id = b.id AND t.lease_epoch = b.epoch AND t.status = 'running'
               AND t.kind = 'execute' AND t.workflow_id IS NULL
             RETURNING t.id, t.lease_epoch, COALESCE(b.at, now()) AS at
         ), closed AS (
             UPDATE tenax_attempts a
             SET finished_at = done.at, outcome = 'succeeded', error = NULL
             FROM done
             WHERE a.task_id = done.id AND a.epoch = done.lease_epoch AND a.outcome = 'running'
         )
         SELECT id, lease_epoch FROM done",
    )
    .bind(&ids)
    .bind(&epochs)
    .bind(&results)
    .bind(&nows)
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)
}

/// The leases among `items` that still hold (`running` under that epoch).
async fn held_leases(
    tx: &mut Transaction<'static, Postgres>,
    items: &[&TaskCompleteParams],
) -> Result<Vec<(i64, i64)>> {
    let ids: Vec<i64> = items.iter().map(|p| p.lease.id.0).collect();
    let epochs: Vec<i64> = items.iter().map(|p| p.lease.epoch).collect();
    sqlx::query_as(
        "SELECT t.id, t.lease_epoch FROM tenax_tasks t
         JOIN unnest($1::bigint[], $2::bigint[]) AS l(id, epoch)
           ON t.id = l.id AND t.lease_epoch = l.epoch
         WHERE t.status = 'running'",
    )
    .bind(&ids)
    .bind(&epochs)
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)
}

/// The writes after a task's attempt, each one whole call: the `Storage` forwarders
/// (`shared/storage.rs`) run them under [`PgStorage::timed`], so they time nothing
/// themselves.
impl PgStorage {
    pub(super) async fn complete_impl(&self, params: &TaskCompleteParams) -> Result<bool> {
        let mut tx = self.begin().await?;
        let Some(woke) = complete_in(&mut tx, params).await? else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        tx.commit().await.map_err(map_err)?;
        if woke {
            self.wake();
        }
        Ok(true)
    }

    pub(super) async fn fail_impl(&self, params: &TaskFailParams) -> Result<bool> {
        let error = truncate_error(&params.error);
        let plan = FailPlan::of(params.next);
        let delay_ms = duration_ms(plan.delay);
        let mut tx = self.begin().await?;
        // The rule of `FailPlan::status`, in SQL: asked to die, else cancelled when asked
        // or requested, else dead out of attempts (counted after a hand-back's refund),
        // else retrying.
        let status = "CASE WHEN $2 THEN 'dead'
                           WHEN $8 OR cancel_requested_at IS NOT NULL THEN 'cancelled'
                           WHEN attempt - $7 >= max_attempts THEN 'dead'
                           ELSE 'retrying' END";
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = {status},
                 attempt = attempt - $7,
                 run_at = {NOW} + $3::float8 * interval '1 millisecond',
                 last_error = $4, updated_at = {NOW},
                 lease_owner = NULL, lease_expires_at = NULL,
                 finished_at = CASE WHEN {status} <> 'retrying' THEN {NOW} END,
                 compensation = CASE WHEN {status} = 'dead' AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END
             WHERE id = $5 AND status = 'running' AND lease_epoch = $6
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(params.now)
        .bind(plan.die)
        .bind(delay_ms as f64)
        .bind(&error)
        .bind(params.lease.id.0)
        .bind(params.lease.epoch)
        .bind(i32::from(plan.refund))
        .bind(plan.cancel)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        };
        let task = task_from_row(&row)?;
        self.failed(tx, params.lease, &task, &error, params.now, delay_ms == 0)
            .await
    }

    pub(super) async fn reap_impl(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        let mut tx = self.begin().await?;
        let beyond = match params.expires_beyond {
            Some(_) => {
                let statement_now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(map_err)?;
                crate::common::reap_beyond(params.now, params.expires_beyond, statement_now)
            }
            None => None,
        };
        // The expiry is checked again in the UPDATE's own WHERE (a completion that
        // commits first always wins), and rows another reaper holds are skipped.
        let rows = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                               WHEN attempt >= max_attempts THEN 'dead' ELSE 'retrying' END,
                 run_at = {NOW},
                 last_error = 'lease expired: worker ' || COALESCE(lease_owner, '?') || ' stopped renewing it',
                 finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR attempt >= max_attempts
                                    THEN {NOW} END,
                 compensation = CASE WHEN cancel_requested_at IS NULL AND attempt >= max_attempts
                                          AND kind = 'execute'
                                     THEN 'pending' ELSE compensation END,
                 lease_owner = NULL, lease_expires_at = NULL, updated_at = {NOW}
             WHERE id IN (SELECT id FROM tenax_tasks
                          WHERE status = 'running'
                            AND (lease_expires_at < {NOW} OR lease_expires_at > $3)
                          ORDER BY lease_expires_at LIMIT $2
                          FOR UPDATE SKIP LOCKED)
               AND status = 'running' AND (lease_expires_at < {NOW} OR lease_expires_at > $3)
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(params.now)
        .bind(i64::from(params.limit))
        .bind(beyond)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let tasks = rows.iter().map(task_from_row).collect::<Result<Vec<_>>>()?;
        self.reaped(tx, tasks, params.now).await
    }

    /// One batch (never empty, checked), with which items repeat an earlier lease.
    pub(super) async fn complete_many_impl(
        &self,
        params: &[TaskCompleteParams],
        repeated: &[bool],
    ) -> Result<Vec<BatchCompletion>> {
        let first = first_named(params, repeated);
        let mut tx = self.begin().await?;
        let landed: HashSet<(i64, i64)> = complete_plain_in(&mut tx, &first)
            .await?
            .into_iter()
            .collect();
        // The leases that did not land but still hold are those of workflow tasks
        // and compensations: left alone, for the one-task path.
        let missed: Vec<&TaskCompleteParams> = first
            .iter()
            .copied()
            .filter(|p| !landed.contains(&(p.lease.id.0, p.lease.epoch)))
            .collect();
        let alone: HashSet<(i64, i64)> = if missed.is_empty() {
            HashSet::new()
        } else {
            held_leases(&mut tx, &missed).await?.into_iter().collect()
        };
        tx.commit().await.map_err(map_err)?;
        Ok(verdicts(params, repeated, &landed, &alone))
    }
}
