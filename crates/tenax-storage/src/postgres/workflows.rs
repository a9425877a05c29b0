//! Workflows on PostgreSQL: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction. Two parents finishing at
//! once update their child's row in turn (the row lock; READ COMMITTED re-reads the
//! row), so its count of unfinished parents reaches zero exactly once.
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tenax_core::{CompensationState, TaskId, TaskNo, TaskRecord};

use super::insert::{insert_many, Existing, WorkflowRows};
use super::rows::{task_from_row, TASK_COLUMNS};
use super::{fetch_ref, map_err, notify, NOW};
use crate::error::Result;
use crate::flow::{WorkflowOf, WorkflowReads, WorkflowTx};
use crate::params::{TaskInsertOutcome, TaskInsertParams, TaskRef};
use crate::workflows::{
    ParentOutcome, StatusCount, WorkflowDetail, WorkflowId, WorkflowInsertParams,
    WorkflowListParams, WorkflowRow, WorkflowState,
};

/// Counts down the children of `$2` and unblocks those at zero (`$1`: clock override).
fn count_down_sql() -> String {
    format!(
        "WITH moved AS (
             UPDATE tenax_tasks
             SET status = CASE WHEN waiting_parents <= 1 THEN 'pending' ELSE status END,
                 run_at = CASE WHEN waiting_parents <= 1 AND run_at < {NOW} THEN {NOW}
                               ELSE run_at END,
                 waiting_parents = waiting_parents - 1,
                 updated_at = {NOW}
             WHERE id IN (SELECT child_id FROM tenax_task_deps WHERE parent_id = $2)
               AND status = 'blocked'
             RETURNING status, queue)
         SELECT queue FROM moved WHERE status = 'pending'"
    )
}

/// Cancels every blocked descendant of `$2` with the error `$3` (`$1`: clock override).
fn cancel_sql() -> String {
    format!(
        "WITH RECURSIVE down(id) AS (
             SELECT child_id FROM tenax_task_deps WHERE parent_id = $2
             UNION
             SELECT d.child_id FROM tenax_task_deps d JOIN down ON d.parent_id = down.id)
         UPDATE tenax_tasks
         SET status = 'cancelled', finished_at = {NOW}, updated_at = {NOW}, last_error = $3
         WHERE id IN (SELECT id FROM down) AND status = 'blocked'"
    )
}

impl super::PgStorage {
    /// The query plans of the statements that move a finished task's dependents (for
    /// the DBA, and for the test that keeps them on index scans).
    #[doc(hidden)]
    pub async fn explain_workflow_propagation(&self, parent: TaskId) -> Result<String> {
        let mut plans = Vec::new();
        for (sql, with_reason) in [(count_down_sql(), false), (cancel_sql(), true)] {
            let explain = format!("EXPLAIN (COSTS OFF) {sql}");
            let mut query = sqlx::query(&explain)
                .bind(None::<DateTime<Utc>>)
                .bind(parent.0);
            if with_reason {
                query = query.bind("explain");
            }
            let rows = query.fetch_all(self.pool()).await.map_err(map_err)?;
            for row in rows {
                plans.push(row.try_get::<String, _>(0).map_err(map_err)?);
            }
        }
        Ok(plans.join("\n"))
    }
}

/// The statements of [`crate::flow`] on PostgreSQL. Each binds its time as `$1` of
/// `COALESCE($1, now())`: the time passed down is the override or the transaction's
/// `now()` already, so the value is the same either way.
impl WorkflowTx for PgConnection {
    async fn insert_workflow(
        &mut self,
        params: &WorkflowInsertParams,
        at: Option<DateTime<Utc>>,
    ) -> Result<(WorkflowId, DateTime<Utc>)> {
        sqlx::query_as(&format!(
            "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
             VALUES ($2, $3, $4, 'running', {NOW}, {NOW}) RETURNING id, created_at"
        ))
        .bind(at)
        .bind(&params.name)
        .bind(params.kind.as_str())
        .bind(params.policy.as_str())
        .fetch_one(&mut *self)
        .await
        .map_err(map_err)
    }

    async fn insert_workflow_tasks(
        &mut self,
        workflow: WorkflowId,
        tasks: &[TaskInsertParams],
        keys: &[&str],
        waiting: &[usize],
        now: DateTime<Utc>,
    ) -> Result<Vec<TaskInsertOutcome>> {
        let rows = WorkflowRows {
            id: workflow,
            keys: keys.to_vec(),
            waiting: waiting
                .iter()
                .map(|n| i32::try_from(*n).unwrap_or(i32::MAX))
                .collect(),
        };
        insert_many(self, tasks, Some(now), Some(&rows), Existing::Skip).await
    }

    async fn insert_dependencies(&mut self, deps: &[(i64, i64)]) -> Result<()> {
        let (children, parents): (Vec<i64>, Vec<i64>) = deps.iter().copied().unzip();
        sqlx::query(
            "INSERT INTO tenax_task_deps (child_id, parent_id)
             SELECT * FROM UNNEST($1::int8[], $2::int8[])",
        )
        .bind(&children)
        .bind(&parents)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        let row: Option<(i64, String, String, String)> = sqlx::query_as(
            "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
             JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = $1",
        )
        .bind(task.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.map(|(id, kind, policy, state)| WorkflowOf::parse(id, &kind, &policy, &state))
            .transpose()
    }

    async fn task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
        fetch_ref(&mut *self, &TaskRef::Id(id)).await
    }

    async fn has_children(&mut self, task: TaskId) -> Result<bool> {
        let child: Option<i64> =
            sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = $1 LIMIT 1")
                .bind(task.0)
                .fetch_optional(&mut *self)
                .await
                .map_err(map_err)?;
        Ok(child.is_some())
    }

    async fn previous_step(&mut self, step: TaskId) -> Result<Option<TaskId>> {
        let previous: Option<i64> =
            sqlx::query_scalar("SELECT parent_id FROM tenax_task_deps WHERE child_id = $1")
                .bind(step.0)
                .fetch_optional(&mut *self)
                .await
                .map_err(map_err)?;
        Ok(previous.map(TaskId))
    }

    /// Returns how many children became `pending`, and notifies their queues.
    async fn count_down_children(&mut self, parent: TaskId, now: DateTime<Utc>) -> Result<u64> {
        let queues: Vec<(String,)> = sqlx::query_as(&count_down_sql())
            .bind(now)
            .bind(parent.0)
            .fetch_all(&mut *self)
            .await
            .map_err(map_err)?;
        let mut distinct: Vec<&str> = queues.iter().map(|(q,)| q.as_str()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        for queue in distinct {
            notify(self, queue).await?;
        }
        Ok(queues.len() as u64)
    }

    async fn cancel_dependents(
        &mut self,
        task: TaskId,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(&cancel_sql())
            .bind(now)
            .bind(task.0)
            .bind(reason)
            .execute(&mut *self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn set_workflow_state(
        &mut self,
        workflow: WorkflowId,
        from: WorkflowState,
        to: WorkflowState,
        finished_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE tenax_workflows SET state = $2, updated_at = {NOW}, finished_at = $3
             WHERE id = $4 AND state = $5"
        ))
        .bind(now)
        .bind(to.as_str())
        .bind(finished_at)
        .bind(workflow)
        .bind(from.as_str())
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn mark_compensation_pending(
        &mut self,
        step: TaskId,
        now: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>> {
        let marked = sqlx::query(&format!(
            "UPDATE tenax_tasks SET compensation = 'pending', updated_at = {NOW}
             WHERE id = $2 AND status = 'succeeded' AND compensation IS NULL
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(step.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        marked.as_ref().map(task_from_row).transpose()
    }

    /// Also notifies the compensation's queue.
    async fn insert_compensation(
        &mut self,
        dead: &TaskRecord,
        task_no: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(&format!(
            "INSERT INTO tenax_tasks (task_no, kind, parent_id, command_type, payload, queue, priority,
                 status, max_attempts, run_at, timeout_ms, last_error, created_at, updated_at,
                 payload_version, created_by)
             VALUES ($2, 'compensate', $3, $4, $5, $6, $7, 'pending', $8, {NOW}, $9, $10, {NOW}, {NOW},
                     $11, $12)
             ON CONFLICT (task_no) DO NOTHING"
        ))
        .bind(now)
        .bind(task_no)
        .bind(dead.id.0)
        .bind(&dead.command_type)
        .bind(&dead.payload)
        .bind(&dead.queue)
        .bind(i16::from(dead.priority.get()))
        .bind(i32::try_from(dead.max_attempts).unwrap_or(i32::MAX))
        .bind(i64::try_from(dead.timeout_ms).unwrap_or(i64::MAX))
        .bind(&dead.last_error)
        .bind(i32::try_from(dead.payload_version).unwrap_or(i32::MAX))
        .bind(&dead.created_by)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        notify(self, &dead.queue).await
    }

    async fn lock_task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = $1 FOR UPDATE"
        ))
        .bind(id.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.as_ref().map(task_from_row).transpose()
    }

    async fn lock_workflow_tasks(&mut self, id: WorkflowId) -> Result<Vec<(String, TaskRecord)>> {
        tasks_of(self, id, " FOR SHARE").await
    }

    async fn lock_workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        let row: Option<(i64, String, String, String)> = sqlx::query_as(
            "SELECT id, kind, policy, state FROM tenax_workflows
             WHERE id = (SELECT workflow_id FROM tenax_tasks WHERE id = $1)
             FOR UPDATE",
        )
        .bind(task.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.map(|(id, kind, policy, state)| WorkflowOf::parse(id, &kind, &policy, &state))
            .transpose()
    }

    async fn rerun(
        &mut self,
        task: TaskId,
        waiting: u32,
        now: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>> {
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = CASE WHEN $3 = 0 THEN 'pending' ELSE 'blocked' END,
                 waiting_parents = $3, attempt = 0, run_at = {NOW}, finished_at = NULL,
                 compensation = NULL, result = NULL, updated_at = {NOW},
                 last_error = CASE WHEN status = 'cancelled' THEN NULL ELSE last_error END
             WHERE id = $2 AND status IN ('succeeded', 'dead', 'cancelled')
               AND (compensation IS NULL OR compensation != 'pending')
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now)
        .bind(task.0)
        .bind(i32::try_from(waiting).unwrap_or(i32::MAX))
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let task = task_from_row(&row)?;
        if waiting == 0 {
            notify(self, &task.queue).await?;
        }
        Ok(Some(task))
    }

    async fn reopen_compensation(
        &mut self,
        task: TaskId,
        epoch: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let reopened = sqlx::query(&format!(
            "UPDATE tenax_tasks SET compensation = 'pending', updated_at = {NOW}
             WHERE id = $2 AND status = 'dead' AND compensation = 'failed' AND lease_epoch = $3"
        ))
        .bind(now)
        .bind(task.0)
        .bind(epoch)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(reopened.rows_affected() == 1)
    }

    async fn record_compensation(
        &mut self,
        task: TaskId,
        state: CompensationState,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE tenax_tasks SET compensation = $2, updated_at = {NOW}
             WHERE id = $3 AND compensation = 'pending'"
        ))
        .bind(now)
        .bind(state.as_str())
        .bind(task.0)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}

fn workflow_row(row: &sqlx::postgres::PgRow) -> Result<WorkflowRow> {
    Ok(WorkflowRow {
        id: row.try_get("id").map_err(map_err)?,
        name: row.try_get("name").map_err(map_err)?,
        kind: row.try_get("kind").map_err(map_err)?,
        policy: row.try_get("policy").map_err(map_err)?,
        state: row.try_get("state").map_err(map_err)?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        finished_at: row.try_get("finished_at").map_err(map_err)?,
    })
}

const WORKFLOW_COLUMNS: &str = "id, name, kind, policy, state, created_at, finished_at";

/// The reads of [`crate::flow`] on PostgreSQL.
impl WorkflowReads for PgConnection {
    async fn workflow_rows(&mut self, params: &WorkflowListParams) -> Result<Vec<WorkflowRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
             WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2"
        ))
        .bind(params.before_id)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        rows.iter().map(workflow_row).collect()
    }

    async fn workflow_row(&mut self, id: WorkflowId) -> Result<Option<WorkflowRow>> {
        let row = sqlx::query(&format!(
            "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.as_ref().map(workflow_row).transpose()
    }

    async fn workflow_tasks(&mut self, id: WorkflowId) -> Result<Vec<(String, TaskRecord)>> {
        tasks_of(self, id, "").await
    }

    async fn workflow_dependencies(&mut self, id: WorkflowId) -> Result<Vec<(i64, i64)>> {
        sqlx::query_as(
            "SELECT d.child_id, d.parent_id FROM tenax_task_deps d
             JOIN tenax_tasks t ON t.id = d.child_id WHERE t.workflow_id = $1",
        )
        .bind(id)
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)
    }

    async fn status_counts(
        &mut self,
        ids: &[WorkflowId],
    ) -> Result<Vec<(WorkflowId, StatusCount)>> {
        let rows = sqlx::query(
            "SELECT workflow_id, status, COUNT(*) AS n, MAX(finished_at) AS last
             FROM tenax_tasks WHERE workflow_id = ANY($1) GROUP BY workflow_id, status",
        )
        .bind(ids)
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let status: String = row.try_get("status").map_err(map_err)?;
                let n: i64 = row.try_get("n").map_err(map_err)?;
                Ok((
                    row.try_get("workflow_id").map_err(map_err)?,
                    (
                        status.parse()?,
                        u64::try_from(n).unwrap_or(0),
                        row.try_get("last").map_err(map_err)?,
                    ),
                ))
            })
            .collect()
    }
}

/// The workflow of a task, if it has one.
pub(super) async fn task_workflow(
    conn: &mut PgConnection,
    id: TaskId,
) -> Result<Option<WorkflowId>> {
    let row = sqlx::query("SELECT workflow_id FROM tenax_tasks WHERE id = $1")
        .bind(id.0)
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    match row {
        Some(row) => row
            .try_get::<Option<i64>, _>("workflow_id")
            .map_err(map_err),
        None => Ok(None),
    }
}

pub(super) async fn parent_results(
    conn: &mut PgConnection,
    id: TaskId,
) -> Result<Vec<ParentOutcome>> {
    let rows = sqlx::query(
        "SELECT p.workflow_key, p.task_no, p.status, p.result FROM tenax_task_deps d
         JOIN tenax_tasks p ON p.id = d.parent_id WHERE d.child_id = $1 ORDER BY p.id",
    )
    .bind(id.0)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    rows.iter()
        .map(|r| {
            let status: String = r.try_get("status").map_err(map_err)?;
            Ok(ParentOutcome {
                key: r
                    .try_get::<Option<String>, _>("workflow_key")
                    .map_err(map_err)?
                    .unwrap_or_default(),
                task_no: TaskNo::from_stored(r.try_get("task_no").map_err(map_err)?),
                status: status.parse()?,
                result: r.try_get("result").map_err(map_err)?,
            })
        })
        .collect()
}

/// Insert a workflow inside the caller's open transaction: its tasks exist if and
/// only if that transaction commits. Same checks as
/// [`Storage::workflow_insert`](crate::Storage::workflow_insert).
pub async fn enqueue_workflow_in(
    tx: &mut Transaction<'_, Postgres>,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    crate::flow::insert(&mut **tx, params).await
}

/// A workflow's tasks with their keys, in id order, read with `lock` (a constant).
async fn tasks_of(
    conn: &mut PgConnection,
    id: WorkflowId,
    lock: &str,
) -> Result<Vec<(String, TaskRecord)>> {
    let rows = sqlx::query(&format!(
        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks WHERE workflow_id = $1 ORDER BY id{lock}"
    ))
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    rows.iter()
        .map(|r| {
            let key: Option<String> = r.try_get("workflow_key").map_err(map_err)?;
            Ok((key.unwrap_or_default(), task_from_row(r)?))
        })
        .collect()
}
