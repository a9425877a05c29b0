//! Workflows on MariaDB/MySQL: inserting one, moving dependents when a task finishes,
//! the saga's compensation chain, and the readers. Every function runs inside the
//! caller's transaction. Two parents finishing at once update their child's row in turn
//! (the row lock; an UPDATE reads the latest committed row), so its count of unfinished
//! parents reaches zero exactly once. MariaDB has no `UPDATE ... RETURNING`: the ids are
//! read first, then written by primary key.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row, Transaction};
use tenax_core::{TaskId, TaskKind, TaskNo, TaskRecord, TaskStatus};

use super::insert::{insert_many, WorkflowRows};
use super::rows::{opt_text, task_from_row, text, TASK_COLUMNS};
use super::{fetch_ref, map_err, push_list, schedule_compensation, storable, DbTime, Lock};
use crate::error::Result;
use crate::params::TaskRef;
use crate::workflows::{
    assemble, check_workflow, created_tasks, detail, ParentOutcome, StatusCount, WorkflowDetail,
    WorkflowId, WorkflowInsertParams, WorkflowKind, WorkflowListParams, WorkflowPolicy,
    WorkflowRecord, WorkflowRow,
};

/// Dependency rows per statement (2 values each).
const DEPS_CHUNK: usize = 400;

async fn clock(conn: &mut MySqlConnection, now: Option<DateTime<Utc>>) -> Result<DbTime> {
    match now {
        Some(now) => Ok(storable(now)),
        None => sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err),
    }
}

/// Insert a workflow on `conn`, inside the caller's transaction.
pub(super) async fn insert(
    conn: &mut MySqlConnection,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    let checked = check_workflow(params)?;
    let now = clock(conn, params.now).await?;
    let done = sqlx::query(
        "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
         VALUES (?, ?, ?, 'running', ?, ?)",
    )
    .bind(&params.name)
    .bind(params.kind.as_str())
    .bind(params.policy.as_str())
    .bind(now)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    let id = i64::try_from(done.last_insert_id())
        .map_err(|_| crate::StorageError::Corrupt("workflow id out of range".into()))?;
    let rows = WorkflowRows {
        id,
        keys: params.tasks.iter().map(|t| t.key.as_str()).collect(),
        waiting: checked.parents.iter().map(|p| p.len() as i64).collect(),
    };
    let now_at = Some(now.and_utc());
    let outcomes = insert_many(conn, &checked.tasks, now_at, Some(&rows)).await?;
    let tasks = created_tasks(params, outcomes)?;
    let mut deps = Vec::new();
    for (child, parents) in checked.parents.iter().enumerate() {
        for parent in parents {
            deps.push((tasks[child].1.id.0, tasks[*parent].1.id.0));
        }
    }
    for chunk in deps.chunks(DEPS_CHUNK) {
        let mut qb =
            QueryBuilder::<MySql>::new("INSERT INTO tenax_task_deps (child_id, parent_id) ");
        qb.push_values(chunk, |mut row, (child, parent)| {
            row.push_bind(*child).push_bind(*parent);
        });
        qb.build().execute(&mut *conn).await.map_err(map_err)?;
    }
    let counts = count_statuses(&tasks);
    let record = assemble(
        WorkflowRow {
            id,
            name: params.name.clone(),
            kind: params.kind.as_str().to_owned(),
            policy: params.policy.as_str().to_owned(),
            state: "running".to_owned(),
            created_at: now.and_utc(),
            finished_at: None,
        },
        &counts,
    )?;
    Ok(detail(record, tasks, &deps))
}

fn count_statuses(tasks: &[(String, TaskRecord)]) -> Vec<StatusCount> {
    let mut counts: HashMap<TaskStatus, u64> = HashMap::new();
    for (_, task) in tasks {
        *counts.entry(task.status).or_default() += 1;
    }
    counts.into_iter().map(|(s, n)| (s, n, None)).collect()
}

/// The workflow a task belongs to: id, kind, policy and stored state.
async fn workflow_of(
    tx: &mut Transaction<'static, MySql>,
    task: TaskId,
) -> Result<Option<(i64, WorkflowKind, WorkflowPolicy, String)>> {
    let row = sqlx::query(
        "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
         JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = ?",
    )
    .bind(task.0)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let kind = text(&row, "kind")?;
    let policy = text(&row, "policy")?;
    let corrupt = |what: &str| crate::StorageError::Corrupt(format!("workflow {what}"));
    Ok(Some((
        row.try_get("id").map_err(map_err)?,
        WorkflowKind::parse(&kind).ok_or_else(|| corrupt(&kind))?,
        WorkflowPolicy::parse(&policy).ok_or_else(|| corrupt(&policy))?,
        text(&row, "state")?,
    )))
}

/// One parent of each child of `parent` finished: count it down; a child at zero
/// becomes `pending` (due now, or later if it was delayed). Returns how many children
/// were counted down.
async fn count_down_children(
    tx: &mut Transaction<'static, MySql>,
    parent: TaskId,
    now: DbTime,
) -> Result<u64> {
    let children: Vec<i64> =
        sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = ?")
            .bind(parent.0)
            .fetch_all(&mut **tx)
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
            .execute(&mut **tx)
            .await
            .map_err(map_err)?
            .rows_affected();
    }
    Ok(moved)
}

/// Cancel every blocked task that depends on `task`, transitively.
async fn cancel_dependents(
    tx: &mut Transaction<'static, MySql>,
    task: &TaskRecord,
    now: DbTime,
) -> Result<()> {
    let ids: Vec<i64> = sqlx::query_scalar(
        "WITH RECURSIVE down(id) AS (
             SELECT child_id FROM tenax_task_deps WHERE parent_id = ?
             UNION
             SELECT d.child_id FROM tenax_task_deps d JOIN down ON d.parent_id = down.id)
         SELECT id FROM down",
    )
    .bind(task.id.0)
    .fetch_all(&mut **tx)
    .await
    .map_err(map_err)?;
    let reason = format!(
        "cancelled: task {} (#{}) it depends on ended {}",
        task.task_no, task.id, task.status
    );
    for chunk in ids.chunks(1_000) {
        let mut qb = QueryBuilder::<MySql>::new(
            "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ",
        );
        qb.push_bind(now)
            .push(", updated_at = ")
            .push_bind(now)
            .push(", last_error = ")
            .push_bind(reason.clone())
            .push(" WHERE status = 'blocked' AND id IN ");
        push_list(&mut qb, chunk.iter().copied());
        qb.build().execute(&mut **tx).await.map_err(map_err)?;
    }
    Ok(())
}

/// Schedule the compensation of a saga step that succeeded (once: its compensation
/// state must still be unset), with `cause` as the error it compensates.
async fn compensate_step(
    tx: &mut Transaction<'static, MySql>,
    step: TaskId,
    cause: Option<&str>,
    now: DbTime,
) -> Result<()> {
    let marked = sqlx::query(
        "UPDATE tenax_tasks SET compensation = 'pending', updated_at = ?
         WHERE id = ? AND status = 'succeeded' AND compensation IS NULL",
    )
    .bind(now)
    .bind(step.0)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    if marked.rows_affected() == 1 {
        let mut task = fetch_ref(&mut **tx, &TaskRef::Id(step), Lock::No)
            .await?
            .ok_or_else(|| crate::StorageError::NotFound(step.to_string()))?;
        task.last_error = cause.map(str::to_owned);
        schedule_compensation(tx, &task, now).await?;
    }
    Ok(())
}

/// A saga step's compensation finished (or the step was cancelled): compensate the
/// step before it, or, at the first step, the saga is compensated.
async fn compensate_before(
    tx: &mut Transaction<'static, MySql>,
    workflow: i64,
    step: &TaskRecord,
    now: DbTime,
) -> Result<()> {
    let previous: Option<i64> =
        sqlx::query_scalar("SELECT parent_id FROM tenax_task_deps WHERE child_id = ?")
            .bind(step.id.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
    match previous {
        Some(previous) => {
            compensate_step(tx, TaskId(previous), step.last_error.as_deref(), now).await
        }
        None => set_state(tx, workflow, "compensating", "compensated", now).await,
    }
}

async fn set_state(
    tx: &mut Transaction<'static, MySql>,
    workflow: i64,
    from: &str,
    to: &str,
    now: DbTime,
) -> Result<()> {
    let finished = if matches!(to, "compensating") {
        None
    } else {
        Some(now)
    };
    sqlx::query(
        "UPDATE tenax_workflows SET state = ?, updated_at = ?, finished_at = ?
         WHERE id = ? AND state = ?",
    )
    .bind(to)
    .bind(now)
    .bind(finished)
    .bind(workflow)
    .bind(from)
    .execute(&mut **tx)
    .await
    .map_err(map_err)?;
    Ok(())
}

/// What a task that just finished (`task`, as written) does to its workflow, in the
/// transaction that finished it. Returns whether a task became `pending`.
pub(super) async fn after_finish(
    tx: &mut Transaction<'static, MySql>,
    task: &TaskRecord,
    now: DbTime,
) -> Result<bool> {
    if task.kind == TaskKind::Compensate {
        let Some(step) = task.parent_id else {
            return Ok(false);
        };
        let Some((id, WorkflowKind::Saga, _, _)) = workflow_of(tx, step).await? else {
            return Ok(false);
        };
        if task.status == TaskStatus::Succeeded {
            let step = fetch_ref(&mut **tx, &TaskRef::Id(step), Lock::No)
                .await?
                .ok_or_else(|| crate::StorageError::NotFound(step.to_string()))?;
            // A failed compensation retried by hand: the saga goes on compensating.
            set_state(tx, id, "compensation_failed", "compensating", now).await?;
            compensate_before(tx, id, &step, now).await?;
        } else if task.status == TaskStatus::Dead {
            set_state(tx, id, "compensating", "compensation_failed", now).await?;
        }
        return Ok(task.status == TaskStatus::Succeeded);
    }
    let Some((id, kind, policy, state)) = workflow_of(tx, task.id).await? else {
        return Ok(false);
    };
    let mut woke = false;
    match task.status {
        TaskStatus::Succeeded => {
            woke = count_down_children(tx, task.id, now).await? > 0;
            if kind == WorkflowKind::Saga {
                if state == "compensating" {
                    // The saga failed while this step ran: undo it too.
                    compensate_step(tx, task.id, Some("the saga failed"), now).await?;
                    woke = true;
                } else if !has_children(tx, task.id).await? {
                    set_state(tx, id, "running", "completed", now).await?;
                }
            }
        }
        TaskStatus::Dead | TaskStatus::Cancelled => {
            match policy {
                WorkflowPolicy::RunAnyway if kind == WorkflowKind::Dag => {
                    woke = count_down_children(tx, task.id, now).await? > 0;
                }
                _ => cancel_dependents(tx, task, now).await?,
            }
            if kind == WorkflowKind::Saga {
                set_state(tx, id, "running", "compensating", now).await?;
                if task.status == TaskStatus::Cancelled {
                    // No compensation of its own: go on with the step before it.
                    compensate_before(tx, id, task, now).await?;
                }
                woke = true;
            }
        }
        _ => {}
    }
    Ok(woke)
}

async fn has_children(tx: &mut Transaction<'static, MySql>, task: TaskId) -> Result<bool> {
    let child: Option<i64> =
        sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = ? LIMIT 1")
            .bind(task.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
    Ok(child.is_some())
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

async fn counts(conn: &mut MySqlConnection, ids: &[i64]) -> Result<HashMap<i64, Vec<StatusCount>>> {
    let mut out: HashMap<i64, Vec<StatusCount>> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let mut qb = QueryBuilder::<MySql>::new(
        "SELECT workflow_id, status, CAST(COUNT(*) AS SIGNED) AS n, MAX(finished_at) AS last
         FROM tenax_tasks WHERE workflow_id IN (",
    );
    let mut list = qb.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    qb.push(") GROUP BY workflow_id, status");
    for row in qb.build().fetch_all(&mut *conn).await.map_err(map_err)? {
        let status = text(&row, "status")?;
        let n: i64 = row.try_get("n").map_err(map_err)?;
        out.entry(row.try_get("workflow_id").map_err(map_err)?)
            .or_default()
            .push((
                status.parse()?,
                u64::try_from(n).unwrap_or(0),
                row.try_get("last").map_err(map_err)?,
            ));
    }
    Ok(out)
}

pub(super) async fn list(
    conn: &mut MySqlConnection,
    params: &WorkflowListParams,
) -> Result<Vec<WorkflowRecord>> {
    let rows = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
         WHERE (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?"
    ))
    .bind(params.before_id)
    .bind(params.before_id)
    .bind(i64::from(params.limit))
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let rows = rows.iter().map(workflow_row).collect::<Result<Vec<_>>>()?;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let counts = counts(conn, &ids).await?;
    rows.into_iter()
        .map(|row| {
            let c = counts.get(&row.id).cloned().unwrap_or_default();
            assemble(row, &c)
        })
        .collect()
}

pub(super) async fn get(
    conn: &mut MySqlConnection,
    id: WorkflowId,
) -> Result<Option<WorkflowDetail>> {
    let row = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let row = workflow_row(&row)?;
    let tasks = sqlx::query(&format!(
        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks WHERE workflow_id = ? ORDER BY id"
    ))
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?
    .iter()
    .map(|r| {
        Ok((
            opt_text(r, "workflow_key")?.unwrap_or_default(),
            task_from_row(r)?,
        ))
    })
    .collect::<Result<Vec<_>>>()?;
    let deps: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT d.child_id, d.parent_id FROM tenax_task_deps d
         JOIN tenax_tasks t ON t.id = d.child_id WHERE t.workflow_id = ?",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let counts = counts(conn, &[id]).await?;
    let record = assemble(row, counts.get(&id).map_or(&[][..], Vec::as_slice))?;
    Ok(Some(detail(record, tasks, &deps)))
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
    insert(tx, params).await
}
