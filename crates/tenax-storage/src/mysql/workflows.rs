//! Workflows on MariaDB/MySQL: the statements of [`crate::flow`] (which decides what a
//! finished task does to its workflow, and a saga's compensation chain), and the
//! readers. The writes run inside the caller's transaction. Two parents finishing at
//! once update their child's row in turn (the row lock; an UPDATE reads the latest
//! committed row), so its count of unfinished parents reaches zero exactly once.
//! MariaDB has no `UPDATE ... RETURNING`: the ids are read first, then written by
//! primary key. The statements that differ from the other backends' only in spelling
//! are written once, in `crate::flow_sql`.
use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder};
use tenax_core::TaskId;

use super::insert::insert_many;
use super::{map_err, push_list, storable, DbTime};
use crate::error::Result;
use crate::flow::WorkflowOwnTx;
use crate::workflows::{WorkflowId, WorkflowInsertParams};

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

// impl WorkflowTx, WorkflowReads; re-exported: task_workflow, parent_results, enqueue_workflow_in.
crate::flow_sql::workflow_statements!(sqlx::MySqlConnection, sqlx::MySql);

/// The statements of [`crate::flow`] that MariaDB/MySQL writes its own way. Times are
/// bound as `DATETIME(6)` values ([`storable`]).
impl WorkflowOwnTx for MySqlConnection {
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

    crate::flow_sql::insert_workflow_tasks!(MySql, |conn, tasks, now, rows| {
        insert_many(conn, tasks, now, rows)
    });

    crate::flow_sql::insert_dependencies_by_values!(MySql, DEPS_CHUNK);

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
}
