//! Workflows on SQLite: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction (SQLite's single writer
//! serialises them). Those that differ from the other backends' only in spelling are
//! written once, in `crate::flow_sql`.
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use tenax_core::TaskId;

use super::insert::{insert_many, WorkflowRows};
use super::rows::ms;
use super::{map_err, NOW_MS};
use crate::error::Result;
use crate::flow::WorkflowOwnTx;
use crate::params::{TaskInsertOutcome, TaskInsertParams};
use crate::workflows::{WorkflowId, WorkflowInsertParams};

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

// impl WorkflowTx, WorkflowReads; re-exported: task_workflow, parent_results, enqueue_workflow_in.
crate::flow_sql::workflow_statements!(sqlx::SqliteConnection, sqlx::Sqlite);

/// The statements of [`crate::flow`] that SQLite writes its own way. Times are bound as
/// milliseconds.
impl WorkflowOwnTx for SqliteConnection {
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
}
