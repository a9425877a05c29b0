//! Bulk actions on MariaDB/MySQL: one conditional `UPDATE` per kind of change, over the
//! tasks a filter picks (lowest ids first, at most the limit), in one transaction. The
//! pick is a derived table, since MariaDB refuses `LIMIT` in an `IN` subquery and an
//! `UPDATE` reading its own table outside one. The `UPDATE` locks the picked rows by
//! primary key and re-checks the status it moves a task out of (sessions run in READ
//! COMMITTED, so it sees the latest committed row): a task a worker claimed or finished
//! meanwhile is left alone. Every filter value is a bound parameter.
use sqlx::{MySql, QueryBuilder, Transaction};

use super::{clock, map_err, push_list, retrying, storable, DbTime, MySqlStorage};
use crate::bulk::{statuses_for, validate_bulk};
use crate::error::Result;
use crate::params::{BulkAction, TaskBulkOutcome, TaskBulkParams};
use crate::{flow, redrive};

/// Append `WHERE id IN (<the pick>)`: the tasks in `statuses` matching the filter and
/// `extra`, lowest ids first, at most `limit`.
fn push_pick<'a>(
    qb: &mut QueryBuilder<'a, MySql>,
    params: &'a TaskBulkParams,
    statuses: &[&'static str],
    extra: &str,
    limit: u64,
    priority: Option<i64>,
) {
    let filter = &params.filter;
    qb.push(" WHERE id IN (SELECT id FROM (SELECT id FROM tenax_tasks WHERE status IN ");
    push_list(qb, statuses.iter().copied());
    if let Some(command_type) = &filter.command_type {
        qb.push(" AND command_type = ")
            .push_bind(command_type.as_str());
    }
    if let Some(queue) = &filter.queue {
        qb.push(" AND queue = ").push_bind(queue.as_str());
    }
    if let Some(ids) = &filter.ids {
        qb.push(" AND id IN ");
        push_list(qb, ids.iter().map(|id| id.0));
    }
    if let Some(after) = filter.created_after {
        qb.push(" AND created_at >= ").push_bind(storable(after));
    }
    if let Some(before) = filter.created_before {
        qb.push(" AND created_at < ").push_bind(storable(before));
    }
    qb.push(extra);
    if let Some(priority) = priority {
        qb.push(" AND priority <> ").push_bind(priority);
    }
    qb.push(" ORDER BY id LIMIT ")
        .push_bind(i64::try_from(limit).unwrap_or(i64::MAX));
    qb.push(") AS pick)");
}

async fn run(tx: &mut Transaction<'static, MySql>, mut qb: QueryBuilder<'_, MySql>) -> Result<u64> {
    let done = qb.build().execute(&mut **tx).await.map_err(map_err)?;
    Ok(done.rows_affected())
}

/// Cancel the waiting execute tasks picked, then request a cancel of the running ones
/// without a request yet, up to the limit in all.
async fn cancel(
    tx: &mut Transaction<'static, MySql>,
    params: &TaskBulkParams,
    now: DbTime,
    limit: u64,
) -> Result<(TaskBulkOutcome, bool)> {
    let mut outcome = TaskBulkOutcome::default();
    let mut woke = false;
    let statuses = statuses_for(params, false);
    if !statuses.is_empty() {
        // The waiting tasks of workflows this cancel may reach, locked first: those the
        // cancel below changes move their dependents as a single cancel does.
        let mut qb = QueryBuilder::new("SELECT id FROM tenax_tasks");
        push_pick(
            &mut qb,
            params,
            &statuses,
            " AND kind = 'execute' AND workflow_id IS NOT NULL",
            limit,
            None,
        );
        qb.push(" AND status IN ('pending', 'retrying', 'blocked') FOR UPDATE");
        let in_workflows: Vec<i64> = qb
            .build_query_scalar()
            .fetch_all(&mut **tx)
            .await
            .map_err(map_err)?;
        let mut qb =
            QueryBuilder::new("UPDATE tenax_tasks SET status = 'cancelled', finished_at = ");
        qb.push_bind(now).push(", updated_at = ").push_bind(now);
        push_pick(
            &mut qb,
            params,
            &statuses,
            " AND kind = 'execute'",
            limit,
            None,
        );
        qb.push(" AND status IN ('pending', 'retrying', 'blocked') AND kind = 'execute'");
        outcome.changed = run(tx, qb).await?;
        woke = flow::cancelled(&mut **tx, &in_workflows, now.and_utc()).await?;
    }
    let statuses = statuses_for(params, true);
    let left = limit - outcome.changed;
    if !statuses.is_empty() && left > 0 {
        let mut qb = QueryBuilder::new("UPDATE tenax_tasks SET cancel_requested_at = ");
        qb.push_bind(now).push(", updated_at = ").push_bind(now);
        push_pick(
            &mut qb,
            params,
            &statuses,
            " AND kind = 'execute' AND cancel_requested_at IS NULL",
            left,
            None,
        );
        qb.push(" AND status = 'running' AND kind = 'execute' AND cancel_requested_at IS NULL");
        outcome.cancel_requested = run(tx, qb).await?;
    }
    Ok((outcome, woke))
}

impl MySqlStorage {
    async fn bulk_once(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        let limit = u64::from(params.limit);
        let mut tx = self.begin().await?;
        let now = clock(&mut tx, params.now).await?;
        let mut woke = false;
        let outcome = match params.action {
            BulkAction::Cancel => {
                let (outcome, moved) = cancel(&mut tx, params, now, limit).await?;
                woke = moved;
                outcome
            }
            BulkAction::Retry => {
                let statuses = statuses_for(params, false);
                let mut changed = 0;
                if !statuses.is_empty() {
                    // As task_retry: a dead task whose compensation still runs is not
                    // retried.
                    let mut qb = QueryBuilder::new(
                        "UPDATE tenax_tasks SET status = 'pending', attempt = 0, run_at = ",
                    );
                    qb.push_bind(now)
                        .push(
                            ", finished_at = NULL, compensation = NULL, result = NULL, \
                             updated_at = ",
                        )
                        .push_bind(now);
                    let guard = " AND kind = 'execute' AND workflow_id IS NULL \
                                 AND (compensation IS NULL OR compensation <> 'pending')";
                    push_pick(&mut qb, params, &statuses, guard, limit, None);
                    qb.push(" AND status = 'dead'").push(guard);
                    changed = run(&mut tx, qb).await?;
                    // Workflow tasks and compensations one by one, as task_retry (their
                    // workflow is redriven).
                    let mut qb = QueryBuilder::new("SELECT id FROM tenax_tasks");
                    push_pick(
                        &mut qb,
                        params,
                        &statuses,
                        " AND (kind = 'execute' AND workflow_id IS NOT NULL OR kind = 'compensate' AND parent_id IN (SELECT id FROM tenax_tasks WHERE status = 'dead' AND compensation = 'failed')) \
                          AND (compensation IS NULL OR compensation <> 'pending')",
                        limit - changed,
                        None,
                    );
                    qb.push(" AND status = 'dead' ORDER BY id FOR UPDATE");
                    let ids: Vec<i64> = qb
                        .build_query_scalar()
                        .fetch_all(&mut *tx)
                        .await
                        .map_err(map_err)?;
                    let (more, due) = redrive::retry_each(&mut *tx, &ids, now.and_utc()).await?;
                    changed += more;
                    woke = due;
                }
                TaskBulkOutcome {
                    changed,
                    cancel_requested: 0,
                }
            }
            BulkAction::Reprioritise(priority) => {
                let statuses = statuses_for(params, false);
                let mut changed = 0;
                if !statuses.is_empty() {
                    let priority = i64::from(priority.get());
                    let mut qb = QueryBuilder::new("UPDATE tenax_tasks SET priority = ");
                    qb.push_bind(priority)
                        .push(", updated_at = ")
                        .push_bind(now);
                    push_pick(&mut qb, params, &statuses, "", limit, Some(priority));
                    qb.push(" AND status IN ('pending', 'retrying', 'blocked') AND priority <> ")
                        .push_bind(priority);
                    changed = run(&mut tx, qb).await?;
                }
                TaskBulkOutcome {
                    changed,
                    cancel_requested: 0,
                }
            }
        };
        tx.commit().await.map_err(map_err)?;
        if woke || (outcome.changed > 0 && !matches!(params.action, BulkAction::Cancel)) {
            self.wake();
        }
        Ok(outcome)
    }

    pub(super) async fn task_bulk_impl(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        if !validate_bulk(params)? {
            return Ok(TaskBulkOutcome::default());
        }
        retrying(|| self.bulk_once(params)).await
    }
}
