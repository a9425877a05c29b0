//! Workflows on SQLite: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction (SQLite's single writer
//! serialises them).
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Row, Sqlite, SqliteConnection, Transaction};
use tenax_core::{CompensationState, TaskId, TaskNo, TaskRecord};

use super::insert::{insert_many, WorkflowRows};
use super::rows::{ms, task_from_row, TASK_COLUMNS};
use super::{fetch_ref, map_err, NOW_MS};
use crate::error::Result;
use crate::flow::{WorkflowOf, WorkflowReads, WorkflowTx};
use crate::params::{TaskInsertOutcome, TaskInsertParams, TaskRef};
use crate::workflows::{
    ParentOutcome, StatusCount, WorkflowDetail, WorkflowId, WorkflowInsertParams,
    WorkflowListParams, WorkflowRow, WorkflowState,
};

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

/// The statements of [`crate::flow`] on SQLite. Times are bound as milliseconds.
impl WorkflowTx for SqliteConnection {
    async fn insert_workflow(
        &mut self,
        params: &WorkflowInsertParams,
        at: Option<DateTime<Utc>>,
    ) -> Result<(WorkflowId, DateTime<Utc>)> {
        let now = match at {
            Some(at) => at.timestamp_millis(),
            None => sqlx::query_scalar(NOW_MS)
                .fetch_one(&mut *self)
                .await
                .map_err(map_err)?,
        };
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
             VALUES (?1, ?2, ?3, 'running', ?4, ?4) RETURNING id",
        )
        .bind(&params.name)
        .bind(params.kind.as_str())
        .bind(params.policy.as_str())
        .bind(now)
        .fetch_one(&mut *self)
        .await
        .map_err(map_err)?;
        Ok((id, ms(now)?))
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
            waiting: waiting.iter().map(|n| *n as i64).collect(),
        };
        insert_many(self, tasks, Some(now), Some(&rows)).await
    }

    async fn insert_dependencies(&mut self, deps: &[(i64, i64)]) -> Result<()> {
        for chunk in deps.chunks(DEPS_CHUNK) {
            let mut qb =
                QueryBuilder::<Sqlite>::new("INSERT INTO tenax_task_deps (child_id, parent_id) ");
            qb.push_values(chunk, |mut row, (child, parent)| {
                row.push_bind(*child).push_bind(*parent);
            });
            qb.build().execute(&mut *self).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        let row: Option<(i64, String, String, String)> = sqlx::query_as(
            "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
             JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = ?",
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
            sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = ? LIMIT 1")
                .bind(task.0)
                .fetch_optional(&mut *self)
                .await
                .map_err(map_err)?;
        Ok(child.is_some())
    }

    async fn previous_step(&mut self, step: TaskId) -> Result<Option<TaskId>> {
        let previous: Option<i64> =
            sqlx::query_scalar("SELECT parent_id FROM tenax_task_deps WHERE child_id = ?")
                .bind(step.0)
                .fetch_optional(&mut *self)
                .await
                .map_err(map_err)?;
        Ok(previous.map(TaskId))
    }

    /// Returns how many children became `pending`.
    async fn count_down_children(&mut self, parent: TaskId, now: DateTime<Utc>) -> Result<u64> {
        let statuses: Vec<String> = sqlx::query_scalar(
            "UPDATE tenax_tasks
             SET status = CASE WHEN waiting_parents <= 1 THEN 'pending' ELSE status END,
                 run_at = CASE WHEN waiting_parents <= 1 AND run_at < ?1 THEN ?1 ELSE run_at END,
                 waiting_parents = waiting_parents - 1,
                 updated_at = ?1
             WHERE id IN (SELECT child_id FROM tenax_task_deps WHERE parent_id = ?2)
               AND status = 'blocked'
             RETURNING status",
        )
        .bind(now.timestamp_millis())
        .bind(parent.0)
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(statuses.iter().filter(|s| *s == "pending").count() as u64)
    }

    async fn cancel_dependents(
        &mut self,
        task: TaskId,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "WITH RECURSIVE down(id) AS (
                 SELECT child_id FROM tenax_task_deps WHERE parent_id = ?2
                 UNION
                 SELECT d.child_id FROM tenax_task_deps d JOIN down ON d.parent_id = down.id)
             UPDATE tenax_tasks
             SET status = 'cancelled', finished_at = ?1, updated_at = ?1, last_error = ?3
             WHERE id IN (SELECT id FROM down) AND status = 'blocked'",
        )
        .bind(now.timestamp_millis())
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
        sqlx::query(
            "UPDATE tenax_workflows SET state = ?1, updated_at = ?2, finished_at = ?3
             WHERE id = ?4 AND state = ?5",
        )
        .bind(to.as_str())
        .bind(now.timestamp_millis())
        .bind(finished_at.map(|t| t.timestamp_millis()))
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
            "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?1
             WHERE id = ?2 AND status = 'succeeded' AND compensation IS NULL
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now.timestamp_millis())
        .bind(step.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        marked.as_ref().map(task_from_row).transpose()
    }

    async fn insert_compensation(
        &mut self,
        dead: &TaskRecord,
        task_no: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO tenax_tasks (task_no, kind, parent_id, command_type, payload, payload_version,
                 queue, priority, status, max_attempts, run_at, timeout_ms, last_error, created_at,
                 updated_at, created_by)
             VALUES (?1, 'compensate', ?2, ?3, ?4, ?5, ?6, ?7, 'pending', ?8, ?9, ?10, ?11, ?9, ?9, ?12)
             ON CONFLICT (task_no) DO NOTHING",
        )
        .bind(task_no)
        .bind(dead.id.0)
        .bind(&dead.command_type)
        .bind(&dead.payload)
        .bind(i64::from(dead.payload_version))
        .bind(&dead.queue)
        .bind(i64::from(dead.priority.get()))
        .bind(i64::from(dead.max_attempts))
        .bind(now.timestamp_millis())
        .bind(i64::try_from(dead.timeout_ms).unwrap_or(i64::MAX))
        .bind(&dead.last_error)
        .bind(&dead.created_by)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn lock_task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
        self.task(id).await
    }

    async fn lock_workflow_tasks(&mut self, id: WorkflowId) -> Result<Vec<(String, TaskRecord)>> {
        self.workflow_tasks(id).await
    }

    async fn lock_workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        // The transaction is `BEGIN IMMEDIATE`: it holds the one write lock already.
        self.workflow_of(task).await
    }

    async fn rerun(
        &mut self,
        task: TaskId,
        waiting: u32,
        now: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>> {
        let row = sqlx::query(&format!(
            "UPDATE tenax_tasks
             SET status = CASE WHEN ?3 = 0 THEN 'pending' ELSE 'blocked' END,
                 waiting_parents = ?3, attempt = 0, run_at = ?1, finished_at = NULL,
                 compensation = NULL, result = NULL, updated_at = ?1,
                 last_error = CASE WHEN status = 'cancelled' THEN NULL ELSE last_error END
             WHERE id = ?2 AND status IN ('succeeded', 'dead', 'cancelled')
               AND (compensation IS NULL OR compensation != 'pending')
             RETURNING {TASK_COLUMNS}"
        ))
        .bind(now.timestamp_millis())
        .bind(task.0)
        .bind(i64::from(waiting))
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.as_ref().map(task_from_row).transpose()
    }

    async fn reopen_compensation(
        &mut self,
        task: TaskId,
        epoch: Option<i64>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let reopened = sqlx::query(
            "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
             WHERE id = ? AND status = 'dead' AND compensation = 'failed' AND lease_epoch = ?",
        )
        .bind(now.timestamp_millis())
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
        sqlx::query(
            "UPDATE tenax_tasks SET compensation = ?, updated_at = ?
             WHERE id = ? AND compensation = 'pending'",
        )
        .bind(state.as_str())
        .bind(now.timestamp_millis())
        .bind(task.0)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}

fn workflow_row(row: &sqlx::sqlite::SqliteRow) -> Result<WorkflowRow> {
    Ok(WorkflowRow {
        id: row.try_get("id").map_err(map_err)?,
        name: row.try_get("name").map_err(map_err)?,
        kind: row.try_get("kind").map_err(map_err)?,
        policy: row.try_get("policy").map_err(map_err)?,
        state: row.try_get("state").map_err(map_err)?,
        created_at: ms(row.try_get("created_at").map_err(map_err)?)?,
        finished_at: row
            .try_get::<Option<i64>, _>("finished_at")
            .map_err(map_err)?
            .map(ms)
            .transpose()?,
    })
}

const WORKFLOW_COLUMNS: &str = "id, name, kind, policy, state, created_at, finished_at";

/// The reads of [`crate::flow`] on SQLite.
impl WorkflowReads for SqliteConnection {
    async fn workflow_rows(&mut self, params: &WorkflowListParams) -> Result<Vec<WorkflowRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
             WHERE (?1 IS NULL OR id < ?1) ORDER BY id DESC LIMIT ?2"
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
            "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        row.as_ref().map(workflow_row).transpose()
    }

    async fn workflow_tasks(&mut self, id: WorkflowId) -> Result<Vec<(String, TaskRecord)>> {
        let rows = sqlx::query(&format!(
            "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks WHERE workflow_id = ? ORDER BY id"
        ))
        .bind(id)
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                let key: Option<String> = r.try_get("workflow_key").map_err(map_err)?;
                Ok((key.unwrap_or_default(), task_from_row(r)?))
            })
            .collect()
    }

    async fn workflow_dependencies(&mut self, id: WorkflowId) -> Result<Vec<(i64, i64)>> {
        sqlx::query_as(
            "SELECT d.child_id, d.parent_id FROM tenax_task_deps d
             JOIN tenax_tasks t ON t.id = d.child_id WHERE t.workflow_id = ?",
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
        let mut qb = QueryBuilder::<Sqlite>::new(
            "SELECT workflow_id, status, COUNT(*) AS n, MAX(finished_at) AS last
             FROM tenax_tasks WHERE workflow_id IN (",
        );
        let mut list = qb.separated(", ");
        for id in ids {
            list.push_bind(*id);
        }
        qb.push(") GROUP BY workflow_id, status");
        let rows = qb.build().fetch_all(&mut *self).await.map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let status: String = row.try_get("status").map_err(map_err)?;
                let n: i64 = row.try_get("n").map_err(map_err)?;
                let last: Option<i64> = row.try_get("last").map_err(map_err)?;
                Ok((
                    row.try_get("workflow_id").map_err(map_err)?,
                    (
                        status.parse()?,
                        u64::try_from(n).unwrap_or(0),
                        last.map(ms).transpose()?,
                    ),
                ))
            })
            .collect()
    }
}

/// The workflow of a task, if it has one.
pub(super) async fn task_workflow(
    conn: &mut SqliteConnection,
    id: TaskId,
) -> Result<Option<WorkflowId>> {
    let row = sqlx::query("SELECT workflow_id FROM tenax_tasks WHERE id = ?")
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
    conn: &mut SqliteConnection,
    id: TaskId,
) -> Result<Vec<ParentOutcome>> {
    let rows = sqlx::query(
        "SELECT p.workflow_key, p.task_no, p.status, p.result FROM tenax_task_deps d
         JOIN tenax_tasks p ON p.id = d.parent_id WHERE d.child_id = ? ORDER BY p.id",
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
    tx: &mut Transaction<'_, Sqlite>,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    crate::flow::insert(&mut **tx, params).await
}
