//! Workflows on PostgreSQL: inserting one, moving dependents when a task finishes, the
//! saga's compensation chain, and the readers. Every function runs inside the caller's
//! transaction. Two parents finishing at once update their child's row in turn (the
//! row lock; READ COMMITTED re-reads the row), so its count of unfinished parents
//! reaches zero exactly once.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tenax_core::{TaskId, TaskKind, TaskNo, TaskRecord, TaskStatus};

use super::insert::{insert_many, WorkflowRows};
use super::rows::{task_from_row, TASK_COLUMNS};
use super::{fetch_ref, map_err, notify, on_death, NOW};
use crate::error::Result;
use crate::params::TaskRef;
use crate::workflows::{
    assemble, check_workflow, created_tasks, detail, ParentOutcome, StatusCount, WorkflowDetail,
    WorkflowId, WorkflowInsertParams, WorkflowKind, WorkflowListParams, WorkflowPolicy,
    WorkflowRecord, WorkflowRow,
};

/// Insert a workflow on `conn`, inside the caller's transaction.
pub(super) async fn insert(
    conn: &mut PgConnection,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    let checked = check_workflow(params)?;
    let row = sqlx::query(&format!(
        "INSERT INTO tenax_workflows (name, kind, policy, state, created_at, updated_at)
         VALUES ($2, $3, $4, 'running', {NOW}, {NOW}) RETURNING id, created_at"
    ))
    .bind(params.now)
    .bind(&params.name)
    .bind(params.kind.as_str())
    .bind(params.policy.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    let id: i64 = row.try_get("id").map_err(map_err)?;
    let created_at: DateTime<Utc> = row.try_get("created_at").map_err(map_err)?;
    let rows = WorkflowRows {
        id,
        keys: params.tasks.iter().map(|t| t.key.as_str()).collect(),
        waiting: checked
            .parents
            .iter()
            .map(|p| i32::try_from(p.len()).unwrap_or(i32::MAX))
            .collect(),
    };
    let outcomes = insert_many(
        conn,
        &checked.tasks,
        Some(created_at),
        Some(&rows),
        super::insert::Existing::Skip,
    )
    .await?;
    let tasks = created_tasks(params, outcomes)?;
    let mut deps = Vec::new();
    for (child, parents) in checked.parents.iter().enumerate() {
        for parent in parents {
            deps.push((tasks[child].1.id.0, tasks[*parent].1.id.0));
        }
    }
    let (children, parents): (Vec<i64>, Vec<i64>) = deps.iter().copied().unzip();
    sqlx::query(
        "INSERT INTO tenax_task_deps (child_id, parent_id)
         SELECT * FROM UNNEST($1::int8[], $2::int8[])",
    )
    .bind(&children)
    .bind(&parents)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    let counts = count_statuses(&tasks);
    let record = assemble(
        WorkflowRow {
            id,
            name: params.name.clone(),
            kind: params.kind.as_str().to_owned(),
            policy: params.policy.as_str().to_owned(),
            state: "running".to_owned(),
            created_at,
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
    tx: &mut Transaction<'static, Postgres>,
    task: TaskId,
) -> Result<Option<(i64, WorkflowKind, WorkflowPolicy, String)>> {
    let row = sqlx::query(
        "SELECT w.id, w.kind, w.policy, w.state FROM tenax_tasks t
         JOIN tenax_workflows w ON w.id = t.workflow_id WHERE t.id = $1",
    )
    .bind(task.0)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let kind: String = row.try_get("kind").map_err(map_err)?;
    let policy: String = row.try_get("policy").map_err(map_err)?;
    let corrupt = |what: &str| crate::StorageError::Corrupt(format!("workflow {what}"));
    Ok(Some((
        row.try_get("id").map_err(map_err)?,
        WorkflowKind::parse(&kind).ok_or_else(|| corrupt(&kind))?,
        WorkflowPolicy::parse(&policy).ok_or_else(|| corrupt(&policy))?,
        row.try_get("state").map_err(map_err)?,
    )))
}

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

/// One parent of each child of `parent` finished: count it down; a child at zero
/// becomes `pending` (due now, or later if it was delayed). Returns how many did, and
/// wakes their queues.
async fn count_down_children(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    parent: TaskId,
) -> Result<u64> {
    let queues: Vec<(String,)> = sqlx::query_as(&count_down_sql())
        .bind(now)
        .bind(parent.0)
        .fetch_all(&mut **tx)
        .await
        .map_err(map_err)?;
    let mut distinct: Vec<&str> = queues.iter().map(|(q,)| q.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    for queue in distinct {
        notify(tx, queue).await?;
    }
    Ok(queues.len() as u64)
}

/// Cancel every blocked task that depends on `task`, transitively.
async fn cancel_dependents(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    task: &TaskRecord,
) -> Result<()> {
    sqlx::query(&cancel_sql())
        .bind(now)
        .bind(task.id.0)
        .bind(format!(
            "cancelled: task {} (#{}) it depends on ended {}",
            task.task_no, task.id, task.status
        ))
        .execute(&mut **tx)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Schedule the compensation of a saga step that succeeded (once: its compensation
/// state must still be unset), with `cause` as the error it compensates.
async fn compensate_step(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    step: TaskId,
    cause: Option<&str>,
) -> Result<()> {
    let marked = sqlx::query(&format!(
        "UPDATE tenax_tasks SET compensation = 'pending', updated_at = {NOW}
         WHERE id = $2 AND status = 'succeeded' AND compensation IS NULL
         RETURNING {TASK_COLUMNS}"
    ))
    .bind(now)
    .bind(step.0)
    .fetch_optional(&mut **tx)
    .await
    .map_err(map_err)?;
    if let Some(row) = marked {
        let mut task = task_from_row(&row)?;
        task.last_error = cause.map(str::to_owned);
        // The same insert as for a task that died.
        on_death(tx, now, &task).await?;
    }
    Ok(())
}

/// A saga step's compensation finished (or the step was cancelled): compensate the
/// step before it, or, at the first step, the saga is compensated.
async fn compensate_before(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    workflow: i64,
    step: &TaskRecord,
) -> Result<()> {
    let previous: Option<i64> =
        sqlx::query_scalar("SELECT parent_id FROM tenax_task_deps WHERE child_id = $1")
            .bind(step.id.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
    match previous {
        Some(previous) => {
            compensate_step(tx, now, TaskId(previous), step.last_error.as_deref()).await
        }
        None => set_state(tx, now, workflow, "compensating", "compensated").await,
    }
}

async fn set_state(
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    workflow: i64,
    from: &str,
    to: &str,
) -> Result<()> {
    sqlx::query(&format!(
        "UPDATE tenax_workflows
         SET state = $2, updated_at = {NOW},
             finished_at = CASE WHEN $2 = 'compensating' THEN NULL ELSE {NOW} END
         WHERE id = $3 AND state = $4"
    ))
    .bind(now)
    .bind(to)
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
    tx: &mut Transaction<'static, Postgres>,
    now: Option<DateTime<Utc>>,
    task: &TaskRecord,
) -> Result<bool> {
    if task.kind == TaskKind::Compensate {
        let Some(step) = task.parent_id else {
            return Ok(false);
        };
        let Some((id, WorkflowKind::Saga, _, _)) = workflow_of(tx, step).await? else {
            return Ok(false);
        };
        if task.status == TaskStatus::Succeeded {
            let step = fetch_ref(&mut **tx, &TaskRef::Id(step))
                .await?
                .ok_or_else(|| crate::StorageError::NotFound(step.to_string()))?;
            // A failed compensation retried by hand: the saga goes on compensating.
            set_state(tx, now, id, "compensation_failed", "compensating").await?;
            compensate_before(tx, now, id, &step).await?;
        } else if task.status == TaskStatus::Dead {
            set_state(tx, now, id, "compensating", "compensation_failed").await?;
        }
        return Ok(task.status == TaskStatus::Succeeded);
    }
    let Some((id, kind, policy, state)) = workflow_of(tx, task.id).await? else {
        return Ok(false);
    };
    let mut woke = false;
    match task.status {
        TaskStatus::Succeeded => {
            woke = count_down_children(tx, now, task.id).await? > 0;
            if kind == WorkflowKind::Saga {
                if state == "compensating" {
                    // The saga failed while this step ran: undo it too.
                    compensate_step(tx, now, task.id, Some("the saga failed")).await?;
                    woke = true;
                } else if !has_children(tx, task.id).await? {
                    set_state(tx, now, id, "running", "completed").await?;
                }
            }
        }
        TaskStatus::Dead | TaskStatus::Cancelled => {
            match policy {
                WorkflowPolicy::RunAnyway if kind == WorkflowKind::Dag => {
                    woke = count_down_children(tx, now, task.id).await? > 0;
                }
                _ => cancel_dependents(tx, now, task).await?,
            }
            if kind == WorkflowKind::Saga {
                set_state(tx, now, id, "running", "compensating").await?;
                if task.status == TaskStatus::Cancelled {
                    // No compensation of its own: go on with the step before it.
                    compensate_before(tx, now, id, task).await?;
                }
                woke = true;
            }
        }
        _ => {}
    }
    Ok(woke)
}

async fn has_children(tx: &mut Transaction<'static, Postgres>, task: TaskId) -> Result<bool> {
    let child: Option<i64> =
        sqlx::query_scalar("SELECT child_id FROM tenax_task_deps WHERE parent_id = $1 LIMIT 1")
            .bind(task.0)
            .fetch_optional(&mut **tx)
            .await
            .map_err(map_err)?;
    Ok(child.is_some())
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

async fn counts(conn: &mut PgConnection, ids: &[i64]) -> Result<HashMap<i64, Vec<StatusCount>>> {
    let mut out: HashMap<i64, Vec<StatusCount>> = HashMap::new();
    let rows = sqlx::query(
        "SELECT workflow_id, status, COUNT(*) AS n, MAX(finished_at) AS last
         FROM tenax_tasks WHERE workflow_id = ANY($1) GROUP BY workflow_id, status",
    )
    .bind(ids)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    for row in rows {
        let status: String = row.try_get("status").map_err(map_err)?;
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
    conn: &mut PgConnection,
    params: &WorkflowListParams,
) -> Result<Vec<WorkflowRecord>> {
    let rows = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows
         WHERE ($1::bigint IS NULL OR id < $1) ORDER BY id DESC LIMIT $2"
    ))
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

pub(super) async fn get(conn: &mut PgConnection, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
    let row = sqlx::query(&format!(
        "SELECT {WORKFLOW_COLUMNS} FROM tenax_workflows WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    let Some(row) = row else { return Ok(None) };
    let row = workflow_row(&row)?;
    let tasks = sqlx::query(&format!(
        "SELECT {TASK_COLUMNS}, workflow_key FROM tenax_tasks WHERE workflow_id = $1 ORDER BY id"
    ))
    .bind(id)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?
    .iter()
    .map(|r| {
        Ok((
            r.try_get::<Option<String>, _>("workflow_key")
                .map_err(map_err)?
                .unwrap_or_default(),
            task_from_row(r)?,
        ))
    })
    .collect::<Result<Vec<_>>>()?;
    let deps: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT d.child_id, d.parent_id FROM tenax_task_deps d
         JOIN tenax_tasks t ON t.id = d.child_id WHERE t.workflow_id = $1",
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
    insert(tx, params).await
}
