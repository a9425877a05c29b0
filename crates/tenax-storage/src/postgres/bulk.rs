//! Bulk actions on PostgreSQL: one conditional `UPDATE` per kind of change, over the
//! tasks a filter picks (lowest ids first, at most the limit), in one transaction. Each
//! `UPDATE` re-checks the status it moves a task out of, so a task that a worker claimed
//! or finished meanwhile is left alone. Every filter value is a bound parameter.
use sqlx::{Postgres, Row, Transaction};

use super::{clock, map_err, notify, PgStorage, NOW};
use crate::bulk::{statuses_for, validate_bulk};
use crate::error::Result;
use crate::params::{BulkAction, TaskBulkOutcome, TaskBulkParams};
use crate::{flow, redrive};

/// The filter's conditions. Parameters: $2 the statuses, $3 the type, $4 the queue, $5
/// the ids (or NULL), $6 and $7 the creation bounds, $8 the limit.
const PICK: &str = "SELECT id FROM tenax_tasks
     WHERE status = ANY($2::text[])
       AND ($3::text IS NULL OR command_type = $3)
       AND ($4::text IS NULL OR queue = $4)
       AND ($5::bigint[] IS NULL OR id = ANY($5))
       AND ($6::timestamptz IS NULL OR created_at >= $6)
       AND ($7::timestamptz IS NULL OR created_at < $7)";

/// Bind ?1..?8 (and $9, the priority, when given) to `sql` and run it; returns the
/// answer's rows (each `UPDATE` here returns one row per changed task's queue).
async fn apply(
    tx: &mut Transaction<'static, Postgres>,
    sql: &str,
    params: &TaskBulkParams,
    statuses: &[&str],
    limit: u64,
    priority: Option<u8>,
) -> Result<Vec<(String, i64)>> {
    if statuses.is_empty() || limit == 0 {
        return Ok(Vec::new());
    }
    let filter = &params.filter;
    let mut query = sqlx::query(sql)
        .bind(params.now)
        .bind(statuses)
        .bind(filter.command_type.as_deref())
        .bind(filter.queue.as_deref())
        .bind(
            filter
                .ids
                .as_ref()
                .map(|ids| ids.iter().map(|id| id.0).collect::<Vec<i64>>()),
        )
        .bind(filter.created_after)
        .bind(filter.created_before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    if let Some(priority) = priority {
        query = query.bind(i16::from(priority));
    }
    let rows = query.fetch_all(&mut **tx).await.map_err(map_err)?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get::<String, _>(0).map_err(map_err)?,
                row.try_get::<i64, _>(1).map_err(map_err)?,
            ))
        })
        .collect()
}

/// `update` (an `UPDATE ... RETURNING queue`) counted by queue.
fn by_queue(update: &str) -> String {
    format!(
        "WITH moved AS ({update} RETURNING queue) SELECT queue, COUNT(*) FROM moved GROUP BY queue"
    )
}

fn total(counts: &[(String, i64)]) -> u64 {
    counts
        .iter()
        .map(|(_, n)| u64::try_from(*n).unwrap_or(0))
        .sum()
}

impl PgStorage {
    pub(super) async fn task_bulk_impl(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        if !validate_bulk(params)? {
            return Ok(TaskBulkOutcome::default());
        }
        let limit = u64::from(params.limit);
        self.timed(async {
            let mut tx = self.begin().await?;
            let mut outcome = TaskBulkOutcome::default();
            let mut woke = false;
            match params.action {
                BulkAction::Cancel => {
                    // One row per cancelled task: its queue, and its id when it belongs
                    // to a workflow (0 otherwise), whose dependents move as on a cancel.
                    let cancelled = apply(
                        &mut tx,
                        &format!(
                            "WITH moved AS (
                                 UPDATE tenax_tasks
                                 SET status = 'cancelled', finished_at = {NOW}, updated_at = {NOW}
                                 WHERE id IN ({PICK} AND kind = 'execute' ORDER BY id LIMIT $8)
                                   AND status IN ('pending', 'retrying', 'blocked')
                                   AND kind = 'execute'
                                 RETURNING queue, id, workflow_id)
                             SELECT queue, CASE WHEN workflow_id IS NULL THEN 0 ELSE id END
                             FROM moved"
                        ),
                        params,
                        &statuses_for(params, false),
                        limit,
                        None,
                    )
                    .await?;
                    outcome.changed = cancelled.len() as u64;
                    let in_workflows: Vec<i64> = cancelled
                        .iter()
                        .map(|(_, id)| *id)
                        .filter(|id| *id != 0)
                        .collect();
                    if !in_workflows.is_empty() {
                        let now = clock(&mut tx, params.now).await?;
                        woke = flow::cancelled(&mut *tx, &in_workflows, now).await?;
                    }
                    let requested = apply(
                        &mut tx,
                        &by_queue(&format!(
                            "UPDATE tenax_tasks
                             SET cancel_requested_at = {NOW}, updated_at = {NOW}
                             WHERE id IN ({PICK} AND kind = 'execute'
                                            AND cancel_requested_at IS NULL
                                          ORDER BY id LIMIT $8)
                               AND status = 'running' AND kind = 'execute'
                               AND cancel_requested_at IS NULL"
                        )),
                        params,
                        &statuses_for(params, true),
                        limit - outcome.changed,
                        None,
                    )
                    .await?;
                    outcome.cancel_requested = total(&requested);
                }
                BulkAction::Retry => {
                    // Tasks of no workflow in one statement; workflow tasks and
                    // compensations one by one, as task_retry (their workflow is
                    // redriven).
                    let statuses = statuses_for(params, false);
                    let retried = apply(
                        &mut tx,
                        &by_queue(&format!(
                            "UPDATE tenax_tasks
                             SET status = 'pending', attempt = 0, run_at = {NOW},
                                 finished_at = NULL, compensation = NULL, result = NULL,
                                 updated_at = {NOW}
                             WHERE id IN ({PICK} AND kind = 'execute' AND workflow_id IS NULL
                                            AND (compensation IS NULL OR compensation != 'pending')
                                          ORDER BY id LIMIT $8)
                               AND status = 'dead' AND kind = 'execute' AND workflow_id IS NULL
                               AND (compensation IS NULL OR compensation != 'pending')"
                        )),
                        params,
                        &statuses,
                        limit,
                        None,
                    )
                    .await?;
                    outcome.changed = total(&retried);
                    for (queue, _) in &retried {
                        notify(&mut tx, queue).await?;
                    }
                    let rest = apply(
                        &mut tx,
                        &format!(
                            "SELECT queue, id FROM tenax_tasks
                             WHERE id IN ({PICK} AND status = 'dead'
                                            AND (kind = 'execute' AND workflow_id IS NOT NULL OR kind = 'compensate' AND parent_id IN (SELECT id FROM tenax_tasks WHERE status = 'dead' AND compensation = 'failed'))
                                            AND (compensation IS NULL OR compensation != 'pending')
                                          ORDER BY id LIMIT $8)
                               AND COALESCE($1::timestamptz, now()) IS NOT NULL
                             ORDER BY id"
                        ),
                        params,
                        &statuses,
                        limit - outcome.changed,
                        None,
                    )
                    .await?;
                    if !rest.is_empty() {
                        let ids: Vec<i64> = rest.iter().map(|(_, id)| *id).collect();
                        let now = clock(&mut tx, params.now).await?;
                        let (changed, due) = redrive::retry_each(&mut *tx, &ids, now).await?;
                        outcome.changed += changed;
                        woke |= due;
                    }
                }
                BulkAction::Reprioritise(priority) => {
                    let moved = apply(
                        &mut tx,
                        &by_queue(&format!(
                            "UPDATE tenax_tasks SET priority = $9, updated_at = {NOW}
                             WHERE id IN ({PICK} AND priority != $9 ORDER BY id LIMIT $8)
                               AND status IN ('pending', 'retrying', 'blocked')
                               AND priority != $9"
                        )),
                        params,
                        &statuses_for(params, false),
                        limit,
                        Some(priority.get()),
                    )
                    .await?;
                    outcome.changed = total(&moved);
                    for (queue, _) in &moved {
                        notify(&mut tx, queue).await?;
                    }
                }
            }
            tx.commit().await.map_err(map_err)?;
            if woke || (outcome.changed > 0 && !matches!(params.action, BulkAction::Cancel)) {
                self.wake();
            }
            Ok(outcome)
        })
        .await
    }
}
