//! Workflows on MariaDB/MySQL: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction. Two parents finishing at
//! once update their child's row in turn (the row lock; an UPDATE reads the latest
//! committed row), so its count of unfinished parents reaches zero exactly once.
//! MariaDB has no `UPDATE ... RETURNING`: the ids are read first, then written by
//! primary key.
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row, Transaction};
use tenax_core::{CompensationState, TaskId, TaskNo, TaskRecord};

use super::insert::{insert_many, WorkflowRows};
use super::rows::{opt_text, task_from_row, text, TASK_COLUMNS};
use super::{fetch_ref, map_err, push_list, storable, DbTime, Lock};
use crate::error::Result;
use crate::flow::{WorkflowOf, WorkflowReads, WorkflowTx};
use crate::params::{TaskInsertOutcome, TaskInsertParams, TaskRef};
use crate::workflows::{
    ParentOutcome, StatusCount, WorkflowDetail, WorkflowId, WorkflowInsertParams,
    WorkflowListParams, WorkflowRow, WorkflowState,
};

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

/// The statements of [`crate::flow`] on MariaDB/MySQL. Times are bound as `DATETIME(6)`
/// values ([`storable`]).
impl WorkflowTx for MySqlConnection {
    async fn insert_workflow(
        &mut self,
        params: &WorkflowInsertParams,
        at: Option<DateTime<Utc>>,
    ) -> Result<(WorkflowId, DateTime<Utc>)> {
        let now: DbTime = match at {
            Some(at) => storable(at),
            None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
                .fetch_one(&mut *self)
                .await
                .map_err(map_err)?,
        };
        let done = sqlx::query(
            "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
             VALUES (?, ?, ?, 'running', ?, ?)",
        )
        .bind(&params.name)
        .bind(params.kind.as_str())
        .bind(params.policy.as_str())
        .bind(now)
        .bind(now)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        let id = i64::try_from(done.last_insert_id())
            .map_err(|_| crate::StorageError::Corrupt("workflow id out of range".into()))?;
        Ok((id, now.and_utc()))
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
                QueryBuilder::<MySql>::new("INSERT INTO tenax_task_deps (child_id, parent_id) ");
            qb.push_values(chunk, |mut row, (child, parent)| {
                row.push_bind(*child).push_bind(*parent);
            });
            qb.build().execute(&mut *self).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        let row = sqlx::query(
            "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
             JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = ?",
        )
        .bind(task.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        let Some(row) = row else { return Ok(None) };
        WorkflowOf::parse(
            row.try_get("id").map_err(map_err)?,
            &text(&row, "kind")?,
            &text(&row, "policy")?,
            &text(&row, "state")?,
        )
        .map(Some)
    }

    async fn task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
        fetch_ref(&mut *self, &TaskRef::Id(id), Lock::No).await
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

    /// The children are read first, then written by primary key. Returns how many
    /// children were counted down (not only those that became `pending`).
    async fn count_down_children(&mut self, parent: TaskId, now: DateTime<Utc>) -> Result<u64> {
        let now = storable(now);
        let children: Vec<i64> =
            sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = ?")
                .bind(parent.0)
                .fetch_all(&mut *self)
                .await
                .map_err(map_err)?;
        let mut moved = 0;
        for chunk in children.chunks(1_000) {
            // Assigned left to right: status and run_at read the count before it drops.
            let mut qb = QueryBuilder::<MySql>::new(
                "UPDATE tenax_tasks
                 SET status = CASE WHEN waiting_parents <= 1 THEN 'pending' ELSE status END,
                     run_at = CASE WHEN waiting_parents <= 1 AND run_at < ",
            );
            qb.push_bind(now)
                .push(" THEN ")
                .push_bind(now)
                .push(" ELSE run_at END, waiting_parents = waiting_parents - 1, updated_at = ")
                .push_bind(now)
                .push(" WHERE status = 'blocked' AND id IN ");
            push_list(&mut qb, chunk.iter().copied());
            moved += qb
                .build()
                .execute(&mut *self)
                .await
                .map_err(map_err)?
                .rows_affected();
        }
        Ok(moved)
    }

    /// The dependents are read first, then written by primary key.
    async fn cancel_dependents(
        &mut self,
        task: TaskId,
        reason: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let now = storable(now);
        let ids: Vec<i64> = sqlx::query_scalar(
            "WITH RECURSIVE down(id) AS (
                 SELECT child_id FROM tenax_task_deps WHERE parent_id = ?
                 UNION
                 SELECT d.child_id FROM tenax_task_deps d JOIN down ON d.parent_id = down.id)
             SELECT id FROM down",
        )
        .bind(task.0)
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        for chunk in ids.chunks(1_000) {
            let mut qb = QueryBuilder::<MySql>::new(
                "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ",
            );
            qb.push_bind(now)
                .push(", updated_at = ")
                .push_bind(now)
                .push(", last_error = ")
                .push_bind(reason)
                .push(" WHERE status = 'blocked' AND id IN ");
            push_list(&mut qb, chunk.iter().copied());
            qb.build().execute(&mut *self).await.map_err(map_err)?;
        }
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
            "UPDATE tenax_workflows SET state = ?, updated_at = ?, finished_at = ?
             WHERE id = ? AND state = ?",
        )
        .bind(to.as_str())
        .bind(storable(now))
        .bind(finished_at.map(storable))
        .bind(workflow)
        .bind(from.as_str())
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    /// Written by primary key, then read back.
    async fn mark_compensation_pending(
        &mut self,
        step: TaskId,
        now: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>> {
        let marked = sqlx::query(
            "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
             WHERE id = ? AND status = 'succeeded' AND compensation IS NULL",
        )
        .bind(storable(now))
        .bind(step.0)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        if marked.rows_affected() != 1 {
            return Ok(None);
        }
        fetch_ref(&mut *self, &TaskRef::Id(step), Lock::No)
            .await?
            .ok_or_else(|| crate::StorageError::NotFound(step.to_string()))
            .map(Some)
    }

    async fn insert_compensation(
        &mut self,
        dead: &TaskRecord,
        task_no: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let now = storable(now);
        // `ON DUPLICATE KEY UPDATE id = id` changes nothing: the compensation of this
        // death exists already.
        sqlx::query(
            "INSERT INTO tenax_tasks (task_no, kind, parent_id, command_type, payload, payload_version,
                 queue, priority, status, max_attempts, run_at, timeout_ms, last_error, created_at,
                 updated_at, created_by)
             VALUES (?, 'compensate', ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE id = id",
        )
        .bind(task_no)
        .bind(dead.id.0)
        .bind(&dead.command_type)
        .bind(&dead.payload)
        .bind(i64::from(dead.payload_version))
        .bind(&dead.queue)
        .bind(i64::from(dead.priority.get()))
        .bind(i64::from(dead.max_attempts))
        .bind(now)
        .bind(i64::try_from(dead.timeout_ms).unwrap_or(i64::MAX))
        .bind(&dead.last_error)
        .bind(now)
        .bind(now)
        .bind(&dead.created_by)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn lock_task(&mut self, id: TaskId) -> Result<Option<TaskRecord>> {
        fetch_ref(&mut *self, &TaskRef::Id(id), Lock::ForUpdate).await
    }

    async fn lock_workflow_tasks(&mut self, id: WorkflowId) -> Result<Vec<(String, TaskRecord)>> {
        tasks_of(self, id, " LOCK IN SHARE MODE").await
    }

    async fn lock_workflow_of(&mut self, task: TaskId) -> Result<Option<WorkflowOf>> {
        let row = sqlx::query(
            "SELECT id, kind, policy, state FROM tenax_workflows
             WHERE id = (SELECT workflow_id FROM tenax_tasks WHERE id = ?)
             FOR UPDATE",
        )
        .bind(task.0)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?;
        let Some(row) = row else { return Ok(None) };
        WorkflowOf::parse(
            row.try_get("id").map_err(map_err)?,
            &text(&row, "kind")?,
            &text(&row, "policy")?,
            &text(&row, "state")?,
        )
        .map(Some)
    }

    async fn rerun(
        &mut self,
        task: TaskId,
        waiting: u32,
        now: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>> {
        let now = storable(now);
        // MariaDB assigns left to right, each seeing the ones before: `last_error` reads
        // the old status, so it comes first.
        let rerun = sqlx::query(
            "UPDATE tenax_tasks
             SET last_error = CASE WHEN status = 'cancelled' THEN NULL ELSE last_error END,
                 status = CASE WHEN ? = 0 THEN 'pending' ELSE 'blocked' END,
                 waiting_parents = ?, attempt = 0, run_at = ?, finished_at = NULL,
                 compensation = NULL, result = NULL, updated_at = ?
             WHERE id = ? AND status IN ('succeeded', 'dead', 'cancelled')
               AND (compensation IS NULL OR compensation <> 'pending')",
        )
        .bind(i64::from(waiting))
        .bind(i64::from(waiting))
        .bind(now)
        .bind(now)
        .bind(task.0)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        if rerun.rows_affected() != 1 {
            return Ok(None);
        }
        fetch_ref(&mut *self, &TaskRef::Id(task), Lock::No).await
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
        .bind(storable(now))
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
        .bind(storable(now))
        .bind(task.0)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}

fn workflow_row(row: &sqlx::mysql::MySqlRow) -> Result<WorkflowRow> {
    Ok(WorkflowRow {
        id: row.try_get("id").map_err(map_err)?,
        name: text(row, "name")?,
        kind: text(row, "kind")?,
        policy: text(row, "policy")?,
        state: text(row, "state")?,
        created_at: row.try_get("created_at").map_err(map_err)?,
        finished_at: row.try_get("finished_at").map_err(map_err)?,
    })
}

const WORKFLOW_COLUMNS: &str = "id, name, kind, policy, state, created_at, finished_at";

/// The reads of [`crate::flow`] on MariaDB/MySQL.
impl WorkflowReads for MySqlConnection {
    async fn workflow_rows(&mut self, params: &WorkflowListParams) -> Result<Vec<WorkflowRow>> {
        let rows = sqlx::query(&format!(
            "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
             WHERE (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?"
        ))
        .bind(params.before_id)
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
        tasks_of(self, id, "").await
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
        let mut qb = QueryBuilder::<MySql>::new(
            "SELECT workflow_id, status, CAST(COUNT(*) AS SIGNED) AS n, MAX(finished_at) AS last
             FROM tenax_tasks WHERE workflow_id IN ",
        );
        push_list(&mut qb, ids.iter().copied());
        qb.push(" GROUP BY workflow_id, status");
        let rows = qb.build().fetch_all(&mut *self).await.map_err(map_err)?;
        rows.iter()
            .map(|row| {
                let n: i64 = row.try_get("n").map_err(map_err)?;
                Ok((
                    row.try_get("workflow_id").map_err(map_err)?,
                    (
                        text(row, "status")?.parse()?,
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
    conn: &mut MySqlConnection,
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
    conn: &mut MySqlConnection,
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
            Ok(ParentOutcome {
                key: opt_text(r, "workflow_key")?.unwrap_or_default(),
                task_no: TaskNo::from_stored(text(r, "task_no")?),
                status: text(r, "status")?.parse()?,
                result: opt_text(r, "result")?,
            })
        })
        .collect()
}

/// Insert a workflow inside the caller's open transaction: its tasks exist if and
/// only if that transaction commits. Same checks as
/// [`Storage::workflow_insert`](crate::Storage::workflow_insert).
pub async fn enqueue_workflow_in(
    tx: &mut Transaction<'_, MySql>,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    crate::flow::insert(&mut **tx, params).await
}

/// A workflow's tasks with their keys, in id order, read with `lock` (a constant).
async fn tasks_of(
    conn: &mut MySqlConnection,
    id: WorkflowId,
    lock: &str,
) -> Result<Vec<(String, TaskRecord)>> {
    let rows = sqlx::query(&format!(
        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks WHERE workflow_id = ? ORDER BY id{lock}"
    ))
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    rows.iter()
        .map(|r| {
            Ok((
                opt_text(r, "workflow_key")?.unwrap_or_default(),
                task_from_row(r)?,
            ))
        })
        .collect()
}
