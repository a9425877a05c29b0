//! Inserting tasks: one statement per chunk of rows, shared by `task_insert`,
//! `task_insert_many` and the functions that insert inside a caller's transaction.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use tenax_core::TaskRecord;

use super::rows::{task_from_row, TASK_COLUMNS};
use super::{map_err, NOW_MS};
use crate::common::{by_position, duration_ms, resolve_many};
use crate::error::Result;
use crate::params::{RunAt, TaskInsertOutcome, TaskInsertParams};

/// Rows per statement: 20 bound values each, well under SQLite's 32,766 variables.
const CHUNK: usize = 500;

/// The workflow a bulk insert's tasks belong to.
pub(super) type WorkflowRows<'a> = crate::flow_sql::WorkflowRows<'a, i64>;

/// Insert `tasks` (already validated) on `conn`, inside
/// the caller's transaction; nothing is committed here. With `workflow`, the tasks
/// belong to it: each gets its key, and one with parents waits `blocked`.
pub(super) async fn insert_many(
    conn: &mut SqliteConnection,
    tasks: &[TaskInsertParams],
    now: Option<DateTime<Utc>>,
    workflow: Option<&WorkflowRows<'_>>,
) -> Result<Vec<TaskInsertOutcome>> {
    let now = match now {
        Some(now) => now.timestamp_millis(),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?,
    };
    let mut created: HashMap<String, TaskRecord> = HashMap::new();
    for (c, chunk) in tasks.chunks(CHUNK).enumerate() {
        let mut qb = QueryBuilder::<Sqlite>::new(
            "INSERT INTO tenax_tasks (task_no, kind, command_type, payload, payload_version, queue,
                 priority, status, max_attempts, run_at, timeout_ms, created_at, updated_at,
                 concurrency_key, concurrency_limit, workflow_id, workflow_key, waiting_parents,
                 callback_url, created_by) ",
        );
        qb.push_values(chunk.iter().enumerate(), |mut row, (i, task)| {
            let (workflow_id, key, waiting) = match workflow {
                Some(w) => {
                    let n = c * CHUNK + i;
                    (Some(w.id), Some(w.keys[n]), w.waiting[n])
                }
                None => (None, None, 0),
            };
            let run_at = match task.run_at {
                RunAt::Now => now,
                RunAt::In(delay) => now.saturating_add(duration_ms(delay)),
                RunAt::At(at) => at.timestamp_millis(),
            };
            row.push_bind(task.task_no.as_str())
                .push("'execute'")
                .push_bind(task.command_type.as_str())
                .push_bind(task.payload.as_str())
                .push_bind(i64::from(task.payload_version))
                .push_bind(task.queue.as_str())
                .push_bind(i64::from(task.priority.get()))
                .push_bind(if waiting > 0 { "blocked" } else { "pending" })
                .push_bind(i64::from(task.max_attempts))
                .push_bind(run_at)
                .push_bind(duration_ms(task.timeout))
                .push_bind(now)
                .push_bind(now)
                .push_bind(task.concurrency_key.as_deref())
                .push_bind(i64::from(task.concurrency_limit))
                .push_bind(workflow_id)
                .push_bind(key)
                .push_bind(waiting)
                .push_bind(task.callback_url.as_deref())
                .push_bind(task.created_by.as_deref());
        });
        qb.push(format!(
            " ON CONFLICT (task_no) DO NOTHING RETURNING {TASK_COLUMNS}"
        ));
        let rows = qb.build().fetch_all(&mut *conn).await.map_err(map_err)?;
        for row in &rows {
            let task = task_from_row(row)?;
            created.insert(task.task_no.to_string(), task);
        }
    }
    let missing: Vec<&str> = tasks
        .iter()
        .map(|t| t.task_no.as_str())
        .filter(|no| !created.contains_key(*no))
        .collect();
    let mut existing = HashMap::new();
    for chunk in missing.chunks(CHUNK) {
        let mut qb = QueryBuilder::<Sqlite>::new(format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no IN ("
        ));
        let mut list = qb.separated(", ");
        for no in chunk {
            list.push_bind(*no);
        }
        qb.push(")");
        let rows = qb.build().fetch_all(&mut *conn).await.map_err(map_err)?;
        for row in &rows {
            let task = task_from_row(row)?;
            existing.insert(task.task_no.to_string(), task);
        }
    }
    resolve_many(tasks, by_position(tasks, created), &existing)
}

crate::shared::insert::enqueue_in_api!(
    Sqlite,
    "Workers are woken by their wake-up probe once the transaction commits (or find \
     the task at their next poll when the probe is off).",
    |conn, tasks, now| insert_many(conn, tasks, now, None)
);
