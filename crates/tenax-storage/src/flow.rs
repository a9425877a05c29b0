//! Workflows, sagas and compensations, written once: every decision on the way to a
//! write, over [`WorkflowTx`], the single statements each backend implements for its
//! connection (SQL and row mapping only, as the hooks of `crate::transactional`): those
//! that differ only in spelling once for all three (`crate::flow_sql`), those whose
//! plans or locking differ by each backend ([`WorkflowOwnTx`]).
//!
//! - [`insert`]: a workflow, its tasks and its dependencies, after [`check_workflow`];
//!   [`list`] and [`get`] read them back (over [`WorkflowReads`]).
//! - [`completed`] and [`ended`]: what the transaction that finished a task writes next
//!   (the compensation of a death, the outcome of a compensation, then
//!   [`after_finish`]).
//! - [`after_finish`]: a finished task's dependents are counted down (and become due at
//!   zero) or cancelled, transitively, by the workflow's policy; a saga moves through
//!   its states and compensates its succeeded steps in reverse order, one after another.
//! - [`on_death`]: a dead task gets its compensation task; a dead compensation marks the
//!   task it compensates as not compensated.
//! - [`FailPlan`]: what a failed attempt does to its task (retry, hand-back, cancel,
//!   death).
//!
//! Everything runs inside the caller's transaction, at one time `now`: the caller's
//! override, else the database clock, read once per transaction (SQLite and MariaDB read
//! it when the transaction starts; PostgreSQL's statements take `now()`, the
//! transaction's start, and its callers pass that time as the finished task's row holds
//! it). Every time a decision takes is a `DateTime<Utc>`; each backend turns it into its
//! column type where it binds it.
//!
//! Concurrency is the backends' part: two parents finishing at once update their child's
//! row in turn (SQLite's single writer; the row lock on PostgreSQL and MariaDB, whose
//! `UPDATE` reads the latest committed row in READ COMMITTED), so a child's count of
//! unfinished parents reaches zero exactly once.
use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskId, TaskKind, TaskRecord, TaskStatus};

use crate::common::compensation_task_no;
use crate::error::{Result, StorageError};
use crate::params::{FailNext, TaskInsertOutcome, TaskInsertParams};
use crate::workflows::{
    assemble, check_workflow, created_tasks, detail, StatusCount, WorkflowDetail, WorkflowId,
    WorkflowInsertParams, WorkflowKind, WorkflowListParams, WorkflowPolicy, WorkflowRecord,
    WorkflowRow, WorkflowState,
};

/// What a failed attempt asks of its task's row, decided once from [`FailNext`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FailPlan {
    /// The task dies, whatever its budget says.
    pub(crate) die: bool,
    /// How long after now a retried task is due again.
    pub(crate) delay: Duration,
    /// The attempt is given back: a hand-back (shutdown) does not count against the
    /// budget, so it never kills a task.
    pub(crate) refund: bool,
    /// The task ends `cancelled` (unless it dies).
    pub(crate) cancel: bool,
}

impl FailPlan {
    /// The plan for what the worker asked.
    pub(crate) fn of(next: FailNext) -> Self {
        let plan = Self {
            die: false,
            delay: Duration::ZERO,
            refund: false,
            cancel: false,
        };
        match next {
            FailNext::Retry(delay) => Self { delay, ..plan },
            FailNext::Dead => Self { die: true, ..plan },
            FailNext::HandBack => Self {
                refund: true,
                ..plan
            },
            FailNext::Cancelled => Self {
                cancel: true,
                ..plan
            },
        }
    }

    /// The task's attempt count once the failure is written.
    #[cfg(any(feature = "mysql", test))]
    pub(crate) fn attempt_after(self, attempt: u32) -> u32 {
        attempt.saturating_sub(u32::from(self.refund))
    }

    /// The status the failed task takes, from its attempt count as
    /// [`attempt_after`](Self::attempt_after) leaves it: `dead` when asked, else
    /// `cancelled` when asked or when its cancel was requested (a task whose cancel was
    /// requested is not retried), else `dead` out of attempts (the budget is enforced
    /// here, not only by the worker), else `retrying`. SQLite and PostgreSQL write this
    /// rule as the `CASE` of their one `UPDATE`; MariaDB, whose `SET` assignments see
    /// each other's new values, takes it from here, for the row it locked.
    #[cfg(any(feature = "mysql", test))]
    pub(crate) fn status(
        self,
        attempt: u32,
        max_attempts: u32,
        cancel_requested: bool,
    ) -> TaskStatus {
        if self.die {
            TaskStatus::Dead
        } else if self.cancel || cancel_requested {
            TaskStatus::Cancelled
        } else if attempt >= max_attempts {
            TaskStatus::Dead
        } else {
            TaskStatus::Retrying
        }
    }
}

/// The workflow a task belongs to, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WorkflowOf {
    pub(crate) id: WorkflowId,
    pub(crate) kind: WorkflowKind,
    pub(crate) policy: WorkflowPolicy,
    pub(crate) state: WorkflowState,
}

impl WorkflowOf {
    /// From the stored names; a name this version does not know is corruption.
    pub(crate) fn parse(id: WorkflowId, kind: &str, policy: &str, state: &str) -> Result<Self> {
        let corrupt = |what: &str| StorageError::Corrupt(format!("workflow {what}"));
        Ok(Self {
            id,
            kind: WorkflowKind::parse(kind).ok_or_else(|| corrupt(kind))?,
            policy: WorkflowPolicy::parse(policy).ok_or_else(|| corrupt(policy))?,
            state: WorkflowState::parse(state).ok_or_else(|| corrupt(state))?,
        })
    }
}

/// The statements of workflows and compensations that each backend writes its own way:
/// the workflow insert, whose clock differs (PostgreSQL takes `COALESCE($1, now())` in
/// the statement and returns the id and the time; SQLite and MariaDB read the clock
/// first, bind it, and take the id from `RETURNING` or, on MariaDB, `last_insert_id()`,
/// reading nothing back); the bulk inserts, whose plans differ (rows in one `VALUES`
/// list, or `UNNEST`ed arrays); and the propagation through a workflow's dependencies,
/// whose plans and locking differ (PostgreSQL notifies the queues of the tasks it made
/// due, and keeps its plans on index scans; MariaDB reads the ids first, then writes
/// them by primary key). Run on the caller's connection, inside its transaction.
pub(crate) trait WorkflowOwnTx: Send {
    /// Insert a `running` workflow created at `at` (the caller's override), else at the
    /// database clock; returns its id and the time it was created at.
    fn insert_workflow(
        &mut self,
        params: &WorkflowInsertParams,
        at: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<(WorkflowId, DateTime<Utc>)>> + Send;

    /// Insert a workflow's tasks (new `task_no`s: a taken one is an outcome, not an
    /// error), created at `now`: the `i`-th with the key `keys[i]`, `blocked` when
    /// `waiting[i]` (its number of parents) is not zero.
    fn insert_workflow_tasks(
        &mut self,
        workflow: WorkflowId,
        tasks: &[TaskInsertParams],
        keys: &[&str],
        waiting: &[usize],
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Vec<TaskInsertOutcome>>> + Send;

    /// Insert the dependencies `(child, parent)`, by task id.
    fn insert_dependencies(
        &mut self,
        deps: &[(i64, i64)],
    ) -> impl Future<Output = Result<()>> + Send;

    /// One parent of each `blocked` child of `parent` finished: count it down; a child
    /// at zero becomes `pending`, due at `now` or at its own later `run_at`. Returns how
    /// many became due (PostgreSQL also notifies their queues); a backend that cannot
    /// tell cheaply returns how many it counted down: the answer only decides whether
    /// this process's workers are woken.
    fn count_down_children(
        &mut self,
        parent: TaskId,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Cancel every `blocked` task that depends on `task`, transitively, with the error
    /// `reason`.
    fn cancel_dependents(
        &mut self,
        task: TaskId,
        reason: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The statements of workflows and compensations on one backend, each run on the
/// caller's connection (inside its transaction), beyond those of [`WorkflowOwnTx`].
/// They differ between the backends only in spelling, and are written once, for all
/// three (`crate::flow_sql`). One statement each, where the database allows: MariaDB,
/// which has no `UPDATE ... RETURNING`, reads the row it writes in a second one. A
/// method decides nothing beyond its `WHERE`: what runs when, and with which values, is
/// decided in this module.
pub(crate) trait WorkflowTx: WorkflowOwnTx {
    /// The workflow `task` belongs to.
    fn workflow_of(
        &mut self,
        task: TaskId,
    ) -> impl Future<Output = Result<Option<WorkflowOf>>> + Send;

    /// A task, by id.
    fn task(&mut self, id: TaskId) -> impl Future<Output = Result<Option<TaskRecord>>> + Send;

    /// Whether any task depends on `task`.
    fn has_children(&mut self, task: TaskId) -> impl Future<Output = Result<bool>> + Send;

    /// The step a saga step waits for (the one before it), if any.
    fn previous_step(
        &mut self,
        step: TaskId,
    ) -> impl Future<Output = Result<Option<TaskId>>> + Send;

    /// Move a workflow from the state `from` (and only from it) to `to`, finished at
    /// `finished_at`.
    fn set_workflow_state(
        &mut self,
        workflow: WorkflowId,
        from: WorkflowState,
        to: WorkflowState,
        finished_at: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Mark the compensation of `step` `pending` if it `succeeded` and was never
    /// compensated; returns the step as written, `None` when it did not qualify.
    fn mark_compensation_pending(
        &mut self,
        step: TaskId,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<TaskRecord>>> + Send;

    /// Insert the compensation task of `dead` under `task_no`, `pending` and due at
    /// `now`, carrying `dead`'s command, payload, queue, priority, budget, error and
    /// `created_by` (nothing when that number exists: the compensation of this death
    /// is there already). PostgreSQL also notifies its queue.
    fn insert_compensation(
        &mut self,
        dead: &TaskRecord,
        task_no: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// A task, by id, its row locked until the transaction ends (SQLite's single writer
    /// holds every row already).
    fn lock_task(&mut self, id: TaskId) -> impl Future<Output = Result<Option<TaskRecord>>> + Send;

    /// A workflow's tasks with their keys, in id order, each row share-locked until the
    /// transaction ends (SQLite's single writer holds every row already): a task that
    /// is finishing is read once its transaction committed, and one that has not begun
    /// to finish waits for this transaction.
    fn lock_workflow_tasks(
        &mut self,
        id: WorkflowId,
    ) -> impl Future<Output = Result<Vec<(String, TaskRecord)>>> + Send;

    /// The workflow `task` belongs to, its row locked until the transaction ends (SQLite's
    /// single writer holds it already), so that retries in one workflow decide in turn.
    fn lock_workflow_of(
        &mut self,
        task: TaskId,
    ) -> impl Future<Output = Result<Option<WorkflowOf>>> + Send;

    /// Run a finished `task` again, if it is still finished and no compensation of it
    /// runs: `pending` and due at `now` when `waiting` is zero (PostgreSQL also notifies
    /// its queue), else `blocked` behind `waiting` parents; with a fresh attempt budget
    /// and no result, error or compensation. Returns it as written.
    fn rerun(
        &mut self,
        task: TaskId,
        waiting: u32,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Option<TaskRecord>>> + Send;

    /// Mark the compensation of `task` `pending` again, if `task` is still `dead` under
    /// `epoch` with a failed compensation; returns whether it was.
    fn reopen_compensation(
        &mut self,
        task: TaskId,
        epoch: Option<i64>,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Record `state` as the compensation of `task`, if it is still `pending`.
    fn record_compensation(
        &mut self,
        task: TaskId,
        state: CompensationState,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// The reads of workflows on one backend: one statement each, on any connection,
/// written once for all three (`crate::flow_sql`).
pub(crate) trait WorkflowReads: Send {
    /// Workflows, newest first: ids below `before_id`, at most `limit`.
    fn workflow_rows(
        &mut self,
        params: &WorkflowListParams,
    ) -> impl Future<Output = Result<Vec<WorkflowRow>>> + Send;

    /// One workflow.
    fn workflow_row(
        &mut self,
        id: WorkflowId,
    ) -> impl Future<Output = Result<Option<WorkflowRow>>> + Send;

    /// A workflow's tasks with their keys, in id order.
    fn workflow_tasks(
        &mut self,
        id: WorkflowId,
    ) -> impl Future<Output = Result<Vec<(String, TaskRecord)>>> + Send;

    /// A workflow's dependencies `(child, parent)`, by task id.
    fn workflow_dependencies(
        &mut self,
        id: WorkflowId,
    ) -> impl Future<Output = Result<Vec<(i64, i64)>>> + Send;

    /// Per workflow of `ids` (never empty) and status: how many tasks, and the latest
    /// `finished_at`.
    fn status_counts(
        &mut self,
        ids: &[WorkflowId],
    ) -> impl Future<Output = Result<Vec<(WorkflowId, StatusCount)>>> + Send;
}

/// [`Storage::workflow_list`](crate::Storage::workflow_list).
pub(crate) async fn list<R: WorkflowReads + ?Sized>(
    conn: &mut R,
    params: &WorkflowListParams,
) -> Result<Vec<WorkflowRecord>> {
    let rows = conn.workflow_rows(params).await?;
    let ids: Vec<WorkflowId> = rows.iter().map(|r| r.id).collect();
    let mut counts = counts(conn, &ids).await?;
    rows.into_iter()
        .map(|row| {
            let c = counts.remove(&row.id).unwrap_or_default();
            assemble(row, &c)
        })
        .collect()
}

/// [`Storage::workflow_get`](crate::Storage::workflow_get).
pub(crate) async fn get<R: WorkflowReads + ?Sized>(
    conn: &mut R,
    id: WorkflowId,
) -> Result<Option<WorkflowDetail>> {
    let Some(row) = conn.workflow_row(id).await? else {
        return Ok(None);
    };
    let tasks = conn.workflow_tasks(id).await?;
    let deps = conn.workflow_dependencies(id).await?;
    let counts = counts(conn, &[id]).await?;
    let record = assemble(row, counts.get(&id).map_or(&[][..], Vec::as_slice))?;
    Ok(Some(detail(record, tasks, &deps)))
}

/// The status counts of the workflows `ids`, by workflow.
async fn counts<R: WorkflowReads + ?Sized>(
    conn: &mut R,
    ids: &[WorkflowId],
) -> Result<HashMap<WorkflowId, Vec<StatusCount>>> {
    let mut out: HashMap<WorkflowId, Vec<StatusCount>> = HashMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    for (id, count) in conn.status_counts(ids).await? {
        out.entry(id).or_default().push(count);
    }
    Ok(out)
}

/// Insert a workflow inside the caller's transaction: the `tenax_workflows` row, its
/// tasks (a task with parents is `blocked` with `waiting_parents` = its parent count),
/// and one `tenax_task_deps` row per dependency.
pub(crate) async fn insert<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    params: &WorkflowInsertParams,
) -> Result<WorkflowDetail> {
    let checked = check_workflow(params)?;
    let (id, created_at) = tx.insert_workflow(params, params.now).await?;
    let keys: Vec<&str> = params.tasks.iter().map(|t| t.key.as_str()).collect();
    let waiting: Vec<usize> = checked.parents.iter().map(Vec::len).collect();
    let outcomes = tx
        .insert_workflow_tasks(id, &checked.tasks, &keys, &waiting, created_at)
        .await?;
    let tasks = created_tasks(params, outcomes)?;
    let mut deps = Vec::new();
    for (child, parents) in checked.parents.iter().enumerate() {
        for parent in parents {
            deps.push((tasks[child].1.id.0, tasks[*parent].1.id.0));
        }
    }
    if !deps.is_empty() {
        tx.insert_dependencies(&deps).await?;
    }
    let record = assemble(
        WorkflowRow {
            id,
            name: params.name.clone(),
            kind: params.kind.as_str().to_owned(),
            policy: params.policy.as_str().to_owned(),
            state: WorkflowState::Running.as_str().to_owned(),
            created_at,
            finished_at: None,
        },
        &count_statuses(&tasks),
    )?;
    Ok(detail(record, tasks, &deps))
}

/// The counts of a workflow's tasks by status, as [`assemble`] takes them.
fn count_statuses(tasks: &[(String, TaskRecord)]) -> Vec<StatusCount> {
    let mut counts: HashMap<TaskStatus, u64> = HashMap::new();
    for (_, task) in tasks {
        *counts.entry(task.status).or_default() += 1;
    }
    counts.into_iter().map(|(s, n)| (s, n, None)).collect()
}

/// After the write that completed `task` (as written, `succeeded`): a compensation
/// records `compensation` on the task it compensates, then [`after_finish`]. Returns
/// whether a task became due.
pub(crate) async fn completed<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    task: &TaskRecord,
    compensation: CompensationState,
    now: DateTime<Utc>,
) -> Result<bool> {
    if let (TaskKind::Compensate, Some(parent)) = (task.kind, task.parent_id) {
        tx.record_compensation(parent, compensation, now).await?;
    }
    after_finish(tx, task, now).await
}

/// After the write that failed, expired or cancelled `task` (as written): a death gets
/// its compensation ([`on_death`]), and a task that finished moves its workflow
/// ([`after_finish`]); one to be retried does neither. Returns whether a task became
/// due.
pub(crate) async fn ended<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    task: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<bool> {
    if task.status == TaskStatus::Dead {
        on_death(tx, task, now).await?;
    }
    if task.status.is_finished() {
        after_finish(tx, task, now).await
    } else {
        Ok(false)
    }
}

/// After a task died: schedule its compensation (a linked task, in this transaction),
/// or, for a compensation task, record that the compensation failed.
pub(crate) async fn on_death<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    dead: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<()> {
    match (dead.kind, dead.parent_id) {
        (TaskKind::Execute, _) => {
            tx.insert_compensation(dead, &compensation_task_no(dead), now)
                .await
        }
        (TaskKind::Compensate, Some(parent)) => {
            tx.record_compensation(parent, CompensationState::Failed, now)
                .await
        }
        (TaskKind::Compensate, None) => Ok(()),
    }
}

/// After a bulk cancel: the tasks `ids` (of workflows) that it cancelled move their
/// dependents as a single cancel does. Returns whether a task became due.
pub(crate) async fn cancelled<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<bool> {
    let mut woke = false;
    for &id in ids {
        let task = tx
            .task(TaskId(id))
            .await?
            .ok_or_else(|| StorageError::NotFound(id.to_string()))?;
        if task.status == TaskStatus::Cancelled {
            woke |= after_finish(tx, &task, now).await?;
        }
    }
    Ok(woke)
}

/// What a task that just finished (`task`, as written) does to its workflow, in the
/// transaction that finished it. Returns whether a task became due.
///
/// The saga's states: `running` until a step dies or is cancelled, then `compensating`
/// while the succeeded steps before it are compensated, last first; `compensated` once
/// the first step is reached, `compensation_failed` when a compensation dies (a retry of
/// it by hand goes back to `compensating`); `completed` when its last step succeeded.
/// A step that succeeds while its saga compensates is compensated too.
pub(crate) async fn after_finish<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    task: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<bool> {
    if task.kind == TaskKind::Compensate {
        return after_compensation(tx, task, now).await;
    }
    let Some(workflow) = tx.workflow_of(task.id).await? else {
        return Ok(false);
    };
    let saga = workflow.kind == WorkflowKind::Saga;
    let mut woke = false;
    match task.status {
        TaskStatus::Succeeded => {
            woke = tx.count_down_children(task.id, now).await? > 0;
            if saga {
                if workflow.state == WorkflowState::Compensating {
                    // The saga failed while this step ran: undo it too.
                    compensate_step(tx, task.id, Some("the saga failed"), now).await?;
                    woke = true;
                } else if !tx.has_children(task.id).await? {
                    set_state(
                        tx,
                        workflow.id,
                        WorkflowState::Running,
                        WorkflowState::Completed,
                        now,
                    )
                    .await?;
                }
            }
        }
        TaskStatus::Dead | TaskStatus::Cancelled => {
            if workflow.policy == WorkflowPolicy::RunAnyway && !saga {
                woke = tx.count_down_children(task.id, now).await? > 0;
            } else {
                let reason = format!(
                    "{}{} (#{}) it depends on ended {}",
                    crate::redrive::CASCADE,
                    task.task_no,
                    task.id,
                    task.status
                );
                tx.cancel_dependents(task.id, &reason, now).await?;
            }
            if saga {
                set_state(
                    tx,
                    workflow.id,
                    WorkflowState::Running,
                    WorkflowState::Compensating,
                    now,
                )
                .await?;
                if task.status == TaskStatus::Cancelled {
                    // No compensation of its own: go on with the step before it.
                    compensate_before(tx, workflow.id, task, now).await?;
                }
                woke = true;
            }
        }
        _ => {}
    }
    Ok(woke)
}

/// A compensation finished: in a saga, one that succeeded goes on with the step before
/// the one it compensated, one that died stops the saga (`compensation_failed`).
async fn after_compensation<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    compensation: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<bool> {
    let Some(step) = compensation.parent_id else {
        return Ok(false);
    };
    let Some(WorkflowOf {
        id,
        kind: WorkflowKind::Saga,
        ..
    }) = tx.workflow_of(step).await?
    else {
        return Ok(false);
    };
    match compensation.status {
        TaskStatus::Succeeded => {
            let step = tx
                .task(step)
                .await?
                .ok_or_else(|| StorageError::NotFound(step.to_string()))?;
            // A failed compensation retried by hand: the saga goes on compensating.
            set_state(
                tx,
                id,
                WorkflowState::CompensationFailed,
                WorkflowState::Compensating,
                now,
            )
            .await?;
            compensate_before(tx, id, &step, now).await?;
            Ok(true)
        }
        TaskStatus::Dead => {
            set_state(
                tx,
                id,
                WorkflowState::Compensating,
                WorkflowState::CompensationFailed,
                now,
            )
            .await?;
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// Schedule the compensation of a saga step that succeeded (once: its compensation
/// state must still be unset), with `cause` as the error it compensates.
async fn compensate_step<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    step: TaskId,
    cause: Option<&str>,
    now: DateTime<Utc>,
) -> Result<()> {
    if let Some(mut step) = tx.mark_compensation_pending(step, now).await? {
        step.last_error = cause.map(str::to_owned);
        // The same insert as for a task that died.
        on_death(tx, &step, now).await?;
    }
    Ok(())
}

/// A saga step's compensation finished (or the step was cancelled): compensate the
/// step before it, or, at the first step, the saga is compensated.
async fn compensate_before<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    workflow: WorkflowId,
    step: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<()> {
    match tx.previous_step(step.id).await? {
        Some(previous) => compensate_step(tx, previous, step.last_error.as_deref(), now).await,
        None => {
            set_state(
                tx,
                workflow,
                WorkflowState::Compensating,
                WorkflowState::Compensated,
                now,
            )
            .await
        }
    }
}

/// Move a workflow from `from` to `to` (nothing when it is not in `from`). It is
/// finished at `now` unless `to` leaves it running.
async fn set_state<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    workflow: WorkflowId,
    from: WorkflowState,
    to: WorkflowState,
    now: DateTime<Utc>,
) -> Result<()> {
    let finished_at = to.is_finished().then_some(now);
    tx.set_workflow_state(workflow, from, to, finished_at, now)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_attempt_dies_only_when_asked_or_out_of_attempts() {
        let retry = FailPlan::of(FailNext::Retry(Duration::from_secs(3)));
        assert_eq!(retry.delay, Duration::from_secs(3));
        assert_eq!(
            retry.status(retry.attempt_after(2), 5, false),
            TaskStatus::Retrying
        );
        assert_eq!(
            retry.status(retry.attempt_after(5), 5, false),
            TaskStatus::Dead
        );
        // A requested cancel ends it cancelled, even out of attempts.
        assert_eq!(
            retry.status(retry.attempt_after(5), 5, true),
            TaskStatus::Cancelled
        );

        let dead = FailPlan::of(FailNext::Dead);
        assert_eq!(
            dead.status(dead.attempt_after(1), 5, true),
            TaskStatus::Dead
        );

        let cancelled = FailPlan::of(FailNext::Cancelled);
        assert_eq!(
            cancelled.status(cancelled.attempt_after(5), 5, false),
            TaskStatus::Cancelled
        );
    }

    #[test]
    fn a_hand_back_gives_its_attempt_back_and_never_kills() {
        let back = FailPlan::of(FailNext::HandBack);
        assert_eq!(back.delay, Duration::ZERO);
        assert_eq!(back.attempt_after(5), 4);
        assert_eq!(back.attempt_after(0), 0);
        assert_eq!(
            back.status(back.attempt_after(5), 5, false),
            TaskStatus::Retrying
        );
    }
}
