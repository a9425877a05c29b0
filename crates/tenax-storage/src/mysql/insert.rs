//! Inserting tasks: a multi-row `INSERT` per chunk of rows, shared by `task_insert`,
//! `task_insert_many` and the functions that insert inside a caller's transaction.
//!
//! MariaDB has no `ON CONFLICT DO NOTHING` that reports which rows were new (`INSERT
//! IGNORE` would also hide other errors). So each chunk first reads which numbers
//! exist, inserts the others in one statement, and only if a concurrent insert of one
//! of them won meanwhile (a duplicate-key error rolls back that statement alone) inserts
//! that chunk's rows one by one.
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder};
use tenax_core::TaskRecord;

use super::rows::{task_from_row, text, TASK_COLUMNS};
use super::{map_err, mysql_error_number, plus, storable, DbTime, ER_DUP_ENTRY};
use crate::common::{by_position, duration_ms, resolve_many};
use crate::error::Result;
use crate::params::{RunAt, TaskInsertOutcome, TaskInsertParams};

/// Rows per statement: 19 bound values each, well under the 65,535 placeholders.
const CHUNK: usize = 1_000;

/// The workflow a bulk insert's tasks belong to.
pub(super) type WorkflowRows<'a> = crate::flow_sql::WorkflowRows<'a, i64>;

/// A task to insert, and its place in a workflow: (workflow id, key, parent count).
type Row<'a> = (&'a TaskInsertParams, Option<(i64, String, i64)>);

fn push_row(qb: &mut QueryBuilder<'_, MySql>, (task, workflow): &Row<'_>, now: DbTime) {
    let run_at = match task.run_at {
        RunAt::Now => now,
        RunAt::In(delay) => plus(now, delay),
        RunAt::At(at) => storable(at),
    };
    let mut row = qb.separated(", ");
    row.push_unseparated("(")
        .push_bind(task.task_no.as_str().to_owned())
        .push("'execute'")
        .push_bind(task.command_type.clone())
        .push_bind(task.payload.clone())
        .push_bind(i64::from(task.payload_version))
        .push_bind(task.queue.clone())
        .push_bind(i64::from(task.priority.get()))
        .push_bind(match workflow {
            Some((_, _, waiting)) if *waiting > 0 => "blocked",
            _ => "pending",
        })
        .push_bind(i64::from(task.max_attempts))
        .push_bind(run_at)
        .push_bind(duration_ms(task.timeout))
        .push_bind(now)
        .push_bind(now)
        .push_bind(task.concurrency_key.clone())
        .push_bind(i64::from(task.concurrency_limit))
        .push_bind(workflow.as_ref().map(|w| w.0))
        .push_bind(workflow.as_ref().map(|w| w.1.clone()))
        .push_bind(workflow.as_ref().map_or(0, |w| w.2))
        .push_bind(task.callback_url.clone())
        .push_bind(task.created_by.clone())
        .push_unseparated(")");
}

/// One `INSERT` of `tasks` (at least one); a duplicate `task_no` fails it whole.
async fn insert_rows(
    conn: &mut MySqlConnection,
    tasks: &[Row<'_>],
    now: DbTime,
) -> std::result::Result<(), sqlx::Error> {
    let mut qb = QueryBuilder::<MySql>::new(
        "INSERT INTO tenax_tasks (task_no, kind, command_type, payload, payload_version, queue,
             priority, status, max_attempts, run_at, timeout_ms, created_at, updated_at,
             concurrency_key, concurrency_limit, workflow_id, workflow_key, waiting_parents,
             callback_url, created_by)
         VALUES ",
    );
    for (i, task) in tasks.iter().enumerate() {
        if i > 0 {
            qb.push(", ");
        }
        push_row(&mut qb, task, now);
    }
    qb.build().execute(&mut *conn).await.map(|_| ())
}

async fn existing_numbers(conn: &mut MySqlConnection, numbers: &[&str]) -> Result<Vec<String>> {
    let mut qb = QueryBuilder::<MySql>::new("SELECT task_no FROM tenax_tasks WHERE task_no IN (");
    let mut list = qb.separated(", ");
    for no in numbers {
        list.push_bind(no.to_string());
    }
    qb.push(")");
    let rows = qb.build().fetch_all(&mut *conn).await.map_err(map_err)?;
    rows.iter().map(|row| text(row, "task_no")).collect()
}

/// Insert `tasks` (already validated) on `conn`, inside
/// the caller's transaction; nothing is committed here. With `workflow`, the tasks
/// belong to it: each gets its key, and one with parents waits `blocked`.
pub(super) async fn insert_many(
    conn: &mut MySqlConnection,
    tasks: &[TaskInsertParams],
    now: Option<DateTime<Utc>>,
    workflow: Option<&WorkflowRows<'_>>,
) -> Result<Vec<TaskInsertOutcome>> {
    let now: DbTime = match now {
        Some(now) => storable(now),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?,
    };
    let mut ours: HashSet<String> = HashSet::new();
    for (c, chunk) in tasks.chunks(CHUNK).enumerate() {
        let numbers: Vec<&str> = chunk.iter().map(|t| t.task_no.as_str()).collect();
        let stored: HashSet<String> = existing_numbers(conn, &numbers)
            .await?
            .into_iter()
            .collect();
        let mut seen = HashSet::new();
        let fresh: Vec<Row<'_>> = chunk
            .iter()
            .enumerate()
            .filter(|(_, t)| {
                let no = t.task_no.as_str();
                !stored.contains(no) && !ours.contains(no) && seen.insert(no)
            })
            .map(|(i, t)| {
                let n = c * CHUNK + i;
                (
                    t,
                    workflow.map(|w| (w.id, w.keys[n].to_owned(), w.waiting[n])),
                )
            })
            .collect();
        if fresh.is_empty() {
            continue;
        }
        match insert_rows(conn, &fresh, now).await {
            Ok(()) => ours.extend(fresh.iter().map(|(t, _)| t.task_no.to_string())),
            // Another transaction inserted one of these numbers since the read: InnoDB
            // reports it once that transaction committed. Only this statement was rolled
            // back; insert the rows one at a time.
            Err(err) if mysql_error_number(&err) == Some(ER_DUP_ENTRY) => {
                for row in fresh {
                    let task = row.0;
                    match insert_rows(conn, std::slice::from_ref(&row), now).await {
                        Ok(()) => {
                            ours.insert(task.task_no.to_string());
                        }
                        Err(err) if mysql_error_number(&err) == Some(ER_DUP_ENTRY) => {}
                        Err(err) => return Err(map_err(err)),
                    }
                }
            }
            Err(err) => return Err(map_err(err)),
        }
    }
    let mut created = HashMap::new();
    let mut existing = HashMap::new();
    let numbers: Vec<&str> = tasks.iter().map(|t| t.task_no.as_str()).collect();
    for chunk in numbers.chunks(CHUNK) {
        let mut qb = QueryBuilder::<MySql>::new(format!(
            "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no IN ("
        ));
        let mut list = qb.separated(", ");
        for no in chunk {
            list.push_bind(no.to_string());
        }
        qb.push(")");
        let rows = qb.build().fetch_all(&mut *conn).await.map_err(map_err)?;
        for row in &rows {
            let task: TaskRecord = task_from_row(row)?;
            let no = task.task_no.to_string();
            if ours.contains(&no) {
                created.insert(no, task);
            } else {
                existing.insert(no, task);
            }
        }
    }
    resolve_many(tasks, by_position(tasks, created), &existing)
}

crate::shared::insert::enqueue_in_api!(
    MySql,
    "Workers are woken by their wake-up probe once the transaction commits (or find \
     the task at their next poll when the probe is off). Use a `READ COMMITTED` \
     transaction, as Tenax's own are, so a concurrent insert of the same number is seen.",
    |conn, tasks, now| insert_many(conn, tasks, now, None)
);
