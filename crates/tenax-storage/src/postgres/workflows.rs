//! Workflows on PostgreSQL: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction. Two parents finishing at
//! once update their child's row in turn (the row lock; READ COMMITTED re-reads the
//! row), so its count of unfinished parents reaches zero exactly once. Those that
//! differ from the other backends' only in spelling are written once, in
//! `crate::flow_sql`.
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use tenax_core::TaskId;

use super::insert::{insert_many, Existing};
use super::{map_err, notify, NOW};
use crate::error::Result;
use crate::flow::WorkflowOwnTx;

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

// impl WorkflowTx, WorkflowReads; re-exported: task_workflow, parent_results, enqueue_workflow_in.
crate::flow_sql::workflow_statements!(sqlx::PgConnection, sqlx::Postgres);

/// The statements of [`crate::flow`] that PostgreSQL writes its own way. Each binds its
/// time as `$1` of `COALESCE($1, now())`: the time passed down is the override or the
/// transaction's `now()` already, so the value is the same either way.
impl WorkflowOwnTx for PgConnection {
    crate::flow_sql::insert_workflow_returning!(sqlx::Postgres);

    crate::flow_sql::insert_workflow_tasks!(sqlx::Postgres, |conn, tasks, now, rows| {
        insert_many(conn, tasks, now, rows, Existing::Skip)
    });

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
}
