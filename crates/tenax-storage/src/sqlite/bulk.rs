//! Bulk actions on SQLite: one conditional `UPDATE` per kind of change, over the tasks a
//! filter picks (lowest ids first, at most the limit), in one `BEGIN IMMEDIATE`
//! transaction. Every filter value is a bound parameter.
use sqlx::{Row, Sqlite, Transaction};

use super::rows::ms;
use super::{clock, map_err, SqliteStorage};
use crate::bulk::{statuses_for, validate_bulk};
use crate::common::json_list;
use crate::error::Result;
use crate::params::{BulkAction, TaskBulkOutcome, TaskBulkParams};
use crate::{flow, redrive};

/// The filter's conditions. Parameters: ?2 the statuses (JSON list), ?3 the type, ?4
/// the queue, ?5 the ids (JSON list or NULL), ?6 and ?7 the creation bounds (ms), ?8 the
/// limit.
const PICK: &str = "SELECT id FROM tenax_tasks
     WHERE status IN (SELECT value FROM json_each(?2))
       AND (?3 IS NULL OR command_type = ?3)
       AND (?4 IS NULL OR queue = ?4)
       AND (?5 IS NULL OR id IN (SELECT value FROM json_each(?5)))
       AND (?6 IS NULL OR created_at >= ?6)
       AND (?7 IS NULL OR created_at < ?7)";

/// One bulk `UPDATE` with its parameters bound (`sql` names ?1 the clock and ?2..?8 as
/// in [`PICK`], and ?9 when `priority` is given).
fn bound<'q>(
    sql: &'q str,
    params: &TaskBulkParams,
    statuses: &[&str],
    now: i64,
    limit: u64,
    priority: Option<u8>,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    let filter = &params.filter;
    let mut query = sqlx::query(sql)
        .bind(now)
        .bind(json_list(statuses))
        .bind(filter.command_type.clone())
        .bind(filter.queue.clone())
        .bind(
            filter
                .ids
                .as_ref()
                .map(|ids| json_list(&ids.iter().map(|id| id.0).collect::<Vec<_>>())),
        )
        .bind(filter.created_after.map(|t| t.timestamp_millis()))
        .bind(filter.created_before.map(|t| t.timestamp_millis()))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX));
    if let Some(priority) = priority {
        query = query.bind(i64::from(priority));
    }
    query
}

/// Run one bulk `UPDATE`; returns how many rows it changed.
async fn apply(
    tx: &mut Transaction<'static, Sqlite>,
    sql: &str,
    params: &TaskBulkParams,
    statuses: &[&str],
    now: i64,
    limit: u64,
    priority: Option<u8>,
) -> Result<u64> {
    if statuses.is_empty() || limit == 0 {
        return Ok(0);
    }
    let done = bound(sql, params, statuses, now, limit, priority)
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
    Ok(done.rows_affected())
}

/// Cancel the waiting tasks the filter picks; returns how many, and the ids of those
/// that belong to a workflow (their dependents move as on a single cancel).
async fn cancel_waiting(
    tx: &mut Transaction<'static, Sqlite>,
    params: &TaskBulkParams,
    now: i64,
    limit: u64,
) -> Result<(u64, Vec<i64>)> {
    let statuses = statuses_for(params, false);
    if statuses.is_empty() || limit == 0 {
        return Ok((0, Vec::new()));
    }
    let sql = format!(
        "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ?1, updated_at = ?1
         WHERE id IN ({PICK} AND kind = 'execute' ORDER BY id LIMIT ?8)
           AND status IN ('pending', 'retrying', 'blocked') AND kind = 'execute'
         RETURNING id, workflow_id"
    );
    let rows = bound(&sql, params, &statuses, now, limit, None)
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)?;
    let mut in_workflows = Vec::new();
    for row in &rows {
        let workflow: Option<i64> = row.try_get(1).map_err(map_err)?;
        if workflow.is_some() {
            in_workflows.push(row.try_get::<i64, _>(0).map_err(map_err)?);
        }
    }
    Ok((rows.len() as u64, in_workflows))
}

impl SqliteStorage {
    pub(super) async fn task_bulk_impl(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        if !validate_bulk(params)? {
            return Ok(TaskBulkOutcome::default());
        }
        let limit = u64::from(params.limit);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let mut outcome = TaskBulkOutcome::default();
        let mut woke = false;
        match params.action {
            BulkAction::Cancel => {
                let (cancelled, in_workflows) = cancel_waiting(&mut tx, params, now, limit).await?;
                outcome.changed = cancelled;
                woke = flow::cancelled(&mut *tx, &in_workflows, ms(now)?).await?;
                outcome.cancel_requested = apply(
                    &mut tx,
                    &format!(
                        "UPDATE tenax_tasks SET cancel_requested_at = ?1, updated_at = ?1
                         WHERE id IN ({PICK} AND kind = 'execute' AND cancel_requested_at IS NULL
                                      ORDER BY id LIMIT ?8)
                           AND status = 'running' AND kind = 'execute'
                           AND cancel_requested_at IS NULL"
                    ),
                    params,
                    &statuses_for(params, true),
                    now,
                    limit - outcome.changed,
                    None,
                )
                .await?;
            }
            BulkAction::Retry => {
                // Tasks of no workflow in one statement; workflow tasks and compensations
                // one by one, as task_retry (their workflow is redriven).
                outcome.changed = apply(
                    &mut tx,
                    &format!(
                        "UPDATE tenax_tasks
                         SET status = 'pending', attempt = 0, run_at = ?1, finished_at = NULL,
                             compensation = NULL, result = NULL, updated_at = ?1
                         WHERE id IN ({PICK} AND kind = 'execute' AND workflow_id IS NULL
                                        AND (compensation IS NULL OR compensation != 'pending')
                                      ORDER BY id LIMIT ?8)
                           AND status = 'dead' AND kind = 'execute' AND workflow_id IS NULL
                           AND (compensation IS NULL OR compensation != 'pending')"
                    ),
                    params,
                    &statuses_for(params, false),
                    now,
                    limit,
                    None,
                )
                .await?;
                let statuses = statuses_for(params, false);
                let rest = limit - outcome.changed;
                if !statuses.is_empty() && rest > 0 {
                    let sql = format!(
                        "{PICK} AND status = 'dead' AND (kind = 'execute' AND workflow_id IS NOT NULL OR kind = 'compensate' AND parent_id IN (SELECT id FROM tenax_tasks WHERE status = 'dead' AND compensation = 'failed'))
                           AND (compensation IS NULL OR compensation != 'pending')
                         ORDER BY id LIMIT ?8"
                    );
                    let ids: Vec<i64> = bound(&sql, params, &statuses, now, rest, None)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(map_err)?
                        .iter()
                        .map(|row| row.try_get(0))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(map_err)?;
                    let (changed, due) = redrive::retry_each(&mut *tx, &ids, ms(now)?).await?;
                    outcome.changed += changed;
                    woke |= due;
                }
            }
            BulkAction::Reprioritise(priority) => {
                outcome.changed = apply(
                    &mut tx,
                    &format!(
                        "UPDATE tenax_tasks SET priority = ?9, updated_at = ?1
                         WHERE id IN ({PICK} AND priority != ?9 ORDER BY id LIMIT ?8)
                           AND status IN ('pending', 'retrying', 'blocked') AND priority != ?9"
                    ),
                    params,
                    &statuses_for(params, false),
                    now,
                    limit,
                    Some(priority.get()),
                )
                .await?;
            }
        }
        tx.commit().await.map_err(map_err)?;
        if woke || (outcome.changed > 0 && !matches!(params.action, BulkAction::Cancel)) {
            // Retried tasks are due now; a new priority may make a task due sooner.
            self.wake();
        }
        Ok(outcome)
    }
}
