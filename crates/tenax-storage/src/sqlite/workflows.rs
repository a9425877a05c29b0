//! Workflows on SQLite: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction (SQLite's single writer
//! serialises them). Those that differ from the other backends' only in spelling are
//! written once, in `crate::flow_sql`.
use chrono::{DateTime, Utc};
use sqlx::{Sqlite, SqliteConnection};
use tenax_core::TaskId;

use super::insert::insert_many;
use super::map_err;
use crate::error::Result;
use crate::flow::WorkflowOwnTx;

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

// impl WorkflowTx, WorkflowReads; re-exported: task_workflow, parent_results, enqueue_workflow_in.
crate::flow_sql::workflow_statements!(sqlx::SqliteConnection, sqlx::Sqlite);

/// The statements of [`crate::flow`] that SQLite writes its own way. Times are bound as
/// milliseconds.
impl WorkflowOwnTx for SqliteConnection {
    crate::flow_sql::insert_workflow_returning!(sqlx::Sqlite);

    crate::flow_sql::insert_workflow_tasks!(Sqlite, |conn, tasks, now, rows| {
        insert_many(conn, tasks, now, rows)
    });

    crate::flow_sql::insert_dependencies_by_values!(Sqlite, DEPS_CHUNK);

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
