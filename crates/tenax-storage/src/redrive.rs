//! Retrying a dead task, written once for every backend: the checks, the write that
//! runs it again, and its workflow's redrive, over the statements of
//! [`WorkflowTx`](crate::flow::WorkflowTx) in the caller's transaction.
//!
//! - A dead task whose compensation still runs is refused: undoing and redoing at the
//!   same time would race.
//! - A dead compensation runs again only while the task it compensates is still the
//!   dead task it compensated (not retried since, which would make it undo a newer run);
//!   that task waits for it again, and its saga goes on compensating once it succeeds.
//! - A workflow task brings back the dependents its death cancelled ([`plan`]): each is
//!   `blocked` again once none of its parents is dead or cancelled, transitively; a task
//!   cancelled by hand stays cancelled, and so do its dependents.
//! - A saga step resumes the chain: the steps before it whose work was compensated (or
//!   whose compensation failed) run again first, from the earliest, then the step, then
//!   the steps after it, and the saga is `running` again. A saga that is still
//!   compensating is refused: its compensations would race the steps that run again.
//!
//! Every check reads before the first write, so a refusal writes nothing and a bulk
//! retry can pass over a refused task in the same transaction. The task's row is
//! locked first, then its workflow's (the order of the transaction that finishes a
//! task), so two retries in one workflow decide one after the other; then every task
//! of the workflow is share-locked and read, so the plan counts no parent that is
//! finishing at the same time.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, TaskId, TaskKind, TaskRecord, TaskStatus};

use crate::common::{compensated_epoch, refusal, stale_compensation};
use crate::error::{Result, StorageError};
use crate::flow::{WorkflowOf, WorkflowReads, WorkflowTx};
use crate::params::TaskRef;
use crate::workflows::{WorkflowKind, WorkflowState};

/// The start of the error [`after_finish`](crate::flow::after_finish) writes on the dependents it cancels:
/// how a redrive tells them from tasks cancelled by hand.
pub(crate) const CASCADE: &str = "cancelled: task ";

/// A retry that was refused: nothing was written.
pub(crate) type Refused = StorageError;

/// Retry `current`, the task `asked` names as read in this transaction. The outer error
/// is a failure (the transaction must not commit); the inner one a refusal, with
/// nothing written. On success: the task as written, and whether a task became due.
pub(crate) async fn retry<T: WorkflowTx + WorkflowReads + ?Sized>(
    tx: &mut T,
    asked: &TaskRef,
    current: Option<TaskRecord>,
    now: DateTime<Utc>,
) -> Result<Result<(TaskRecord, bool), Refused>> {
    // Its row first, then its workflow's: the order of the transaction that finishes a
    // task, so the two wait for each other instead of deadlocking.
    let current = match current {
        Some(read) => tx.lock_task(read.id).await?,
        None => None,
    };
    let task = match current {
        Some(task) if task.status == TaskStatus::Dead => task,
        other => return Ok(Err(refusal(asked, other, "retry it"))),
    };
    if task.compensation == Some(CompensationState::Pending) {
        return Ok(Err(refused(asked, "retry it while its compensation runs")));
    }
    match (task.kind, task.parent_id) {
        (TaskKind::Compensate, Some(parent)) => {
            let epoch = compensated_epoch(&task);
            let compensated = tx.lock_task(parent).await?;
            let still_dead = compensated.is_some_and(|p| {
                p.status == TaskStatus::Dead
                    && p.compensation == Some(CompensationState::Failed)
                    && Some(p.lease_epoch) == epoch
            });
            if !still_dead {
                return Ok(Err(stale_compensation(asked)));
            }
            let Some(again) = tx.rerun(task.id, 0, now).await? else {
                return Ok(Err(refused(asked, "retry it while it changes")));
            };
            if !tx.reopen_compensation(parent, epoch, now).await? {
                return Err(changed(asked));
            }
            Ok(Ok((again, true)))
        }
        (TaskKind::Compensate, None) => rerun_alone(tx, asked, &task, now).await,
        (TaskKind::Execute, _) => match tx.lock_workflow_of(task.id).await? {
            None => rerun_alone(tx, asked, &task, now).await,
            Some(workflow) => {
                // Every task of the workflow as committed, none finishing meanwhile: a
                // parent that finishes while this plan counts it would count down a
                // dependent still cancelled, and the dependent would wait for ever.
                let tasks = tx.lock_workflow_tasks(workflow.id).await?;
                let deps = tx.workflow_dependencies(workflow.id).await?;
                let runs = match plan(&workflow, &tasks, &deps, task.id) {
                    Ok(runs) => runs,
                    Err(action) => return Ok(Err(refused(asked, action))),
                };
                redrive(tx, asked, workflow, &runs, now).await
            }
        },
    }
}

/// Retry the tasks `ids` (dead, as a bulk retry picked them) one by one; a refused one
/// is passed over. Returns how many ran again, and whether a task became due.
pub(crate) async fn retry_each<T: WorkflowTx + WorkflowReads + ?Sized>(
    tx: &mut T,
    ids: &[i64],
    now: DateTime<Utc>,
) -> Result<(u64, bool)> {
    let (mut changed, mut woke) = (0, false);
    for &id in ids {
        let asked = TaskRef::Id(TaskId(id));
        let current = tx.task(TaskId(id)).await?;
        if let Ok((_, due)) = retry(tx, &asked, current, now).await? {
            changed += 1;
            woke |= due;
        }
    }
    Ok((changed, woke))
}

/// Run a task outside any workflow again.
async fn rerun_alone<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    asked: &TaskRef,
    task: &TaskRecord,
    now: DateTime<Utc>,
) -> Result<Result<(TaskRecord, bool), Refused>> {
    Ok(match tx.rerun(task.id, 0, now).await? {
        Some(again) => Ok((again, true)),
        None => Err(refused(asked, "retry it while it changes")),
    })
}

/// Write a redrive's runs (the retried task first), then move a saga back to `running`.
async fn redrive<T: WorkflowTx + ?Sized>(
    tx: &mut T,
    asked: &TaskRef,
    workflow: WorkflowOf,
    runs: &[(TaskId, u32)],
    now: DateTime<Utc>,
) -> Result<Result<(TaskRecord, bool), Refused>> {
    let mut retried = None;
    let mut woke = false;
    for (n, &(id, waiting)) in runs.iter().enumerate() {
        match tx.rerun(id, waiting, now).await? {
            Some(again) => {
                woke |= waiting == 0;
                retried.get_or_insert(again);
            }
            // Nothing is written yet: the retried task changed since it was read.
            None if n == 0 => return Ok(Err(refused(asked, "retry it while it changes"))),
            None => return Err(changed(asked)),
        }
    }
    let Some(retried) = retried else {
        return Err(changed(asked));
    };
    if workflow.kind == WorkflowKind::Saga && workflow.state.is_finished() {
        tx.set_workflow_state(
            workflow.id,
            workflow.state,
            WorkflowState::Running,
            None,
            now,
        )
        .await?;
    }
    Ok(Ok((retried, woke)))
}

/// What a retry of the dead task `retried` runs again in its workflow: each task with
/// the number of parents it waits for (`pending` at zero, else `blocked`), the retried
/// task first; or why the retry is refused. Each move is a transition of
/// `tenax_core::state`: the retried task `ManualRetry` (or `RetryBehind`), an undone
/// saga step `Redo` (or `RedoBehind`), a dependent its death cancelled `Restore`.
pub(crate) fn plan(
    workflow: &WorkflowOf,
    tasks: &[(String, TaskRecord)],
    deps: &[(i64, i64)],
    retried: TaskId,
) -> std::result::Result<Vec<(TaskId, u32)>, &'static str> {
    let mut parents: HashMap<i64, Vec<i64>> = HashMap::new();
    for &(child, parent) in deps {
        parents.entry(child).or_default().push(parent);
    }
    let mut status: HashMap<i64, TaskStatus> =
        tasks.iter().map(|(_, t)| (t.id.0, t.status)).collect();
    let by_id: HashMap<i64, &TaskRecord> = tasks.iter().map(|(_, t)| (t.id.0, t)).collect();
    let mut runs = Vec::new();
    if workflow.kind == WorkflowKind::Saga {
        if workflow.state == WorkflowState::Compensating {
            return Err("retry a step while its saga compensates");
        }
        // The steps before it whose compensation ran (it succeeded, died, or had
        // nothing to undo) run again first, from the earliest: the chain stays in
        // order. They are the ones with a compensation, just before it in the chain.
        let mut undone = Vec::new();
        let mut step = retried.0;
        while let Some(&[previous]) = parents.get(&step).map(Vec::as_slice) {
            match by_id.get(&previous) {
                Some(p) if p.status == TaskStatus::Succeeded && p.compensation.is_some() => {
                    undone.push(previous);
                    step = previous;
                }
                _ => break,
            }
        }
        runs.push((retried, u32::from(!undone.is_empty())));
        for (n, &id) in undone.iter().rev().enumerate() {
            runs.push((TaskId(id), u32::from(n > 0)));
            status.insert(id, TaskStatus::Blocked);
        }
    } else {
        runs.push((retried, 0));
    }
    status.insert(retried.0, TaskStatus::Pending);
    // The dependents its death cancelled, in id order (parents before children), until
    // no more can come back.
    loop {
        let mut more = false;
        for (_, task) in tasks {
            let id = task.id.0;
            if status.get(&id) != Some(&TaskStatus::Cancelled) || !cancelled_by_workflow(task) {
                continue;
            }
            let of = parents.get(&id).map_or(&[][..], Vec::as_slice);
            let failed = |p: &i64| {
                matches!(
                    status.get(p),
                    Some(TaskStatus::Dead | TaskStatus::Cancelled) | None
                )
            };
            if of.iter().any(failed) {
                continue;
            }
            let waiting = of
                .iter()
                .filter(|p| !status.get(p).is_some_and(|s| s.is_finished()))
                .count();
            // A dependent this death cancelled waits for the retried task, or for one
            // brought back behind it; one with no unfinished parent was cancelled by
            // another death, since retried by an older version, and is left alone.
            if waiting == 0 {
                continue;
            }
            runs.push((task.id, u32::try_from(waiting).unwrap_or(u32::MAX)));
            status.insert(id, TaskStatus::Blocked);
            more = true;
        }
        if !more {
            return Ok(runs);
        }
    }
}

/// Whether a cancelled task was cancelled by its workflow (a parent ended without
/// succeeding), not by hand.
fn cancelled_by_workflow(task: &TaskRecord) -> bool {
    task.kind == TaskKind::Execute
        && task
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with(CASCADE))
}

fn refused(asked: &TaskRef, action: &'static str) -> StorageError {
    StorageError::InvalidState {
        task: asked.to_string(),
        status: TaskStatus::Dead,
        action,
    }
}

/// A task of the workflow changed between the redrive's reads and its writes: the
/// transaction is abandoned, and the retry may be asked again.
fn changed(asked: &TaskRef) -> StorageError {
    StorageError::Transient(
        format!("a task of the workflow of {asked} changed during its retry").into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::WorkflowPolicy;
    use chrono::TimeZone;
    use tenax_core::{Priority, TaskNo};

    fn task(id: i64, status: TaskStatus, error: Option<&str>) -> (String, TaskRecord) {
        let at = Utc.timestamp_opt(0, 0).single().unwrap_or_default();
        let record = TaskRecord {
            id: TaskId(id),
            task_no: TaskNo::new(format!("t{id}")).expect("a valid number"),
            kind: TaskKind::Execute,
            parent_id: None,
            command_type: "step".to_owned(),
            payload: "{}".to_owned(),
            payload_version: 1,
            queue: "default".to_owned(),
            priority: Priority::default(),
            status,
            attempt: 0,
            max_attempts: 1,
            lease_epoch: 1,
            lease_owner: None,
            lease_expires_at: None,
            run_at: at,
            timeout_ms: 1_000,
            last_error: error.map(str::to_owned),
            result: None,
            compensation: None,
            created_at: at,
            updated_at: at,
            started_at: None,
            finished_at: None,
            concurrency_key: None,
            concurrency_limit: 0,
            created_by: None,
        };
        (format!("k{id}"), record)
    }

    fn flow(kind: WorkflowKind, state: WorkflowState) -> WorkflowOf {
        WorkflowOf {
            id: 1,
            kind,
            policy: WorkflowPolicy::CancelDependents,
            state,
        }
    }

    const BY_WORKFLOW: Option<&str> = Some("cancelled: task t1 (#1) it depends on ended dead");

    #[test]
    fn a_dag_brings_back_what_the_death_cancelled_but_not_what_a_hand_cancelled() {
        use TaskStatus::*;
        // 1 dead → 2 → 3; 4 cancelled by hand → 5; 6 also waits for a dead 7.
        let tasks = [
            task(1, Dead, Some("boom")),
            task(2, Cancelled, BY_WORKFLOW),
            task(3, Cancelled, BY_WORKFLOW),
            task(4, Cancelled, None),
            task(5, Cancelled, BY_WORKFLOW),
            task(6, Cancelled, BY_WORKFLOW),
            task(7, Dead, Some("boom")),
        ];
        let deps = [(2, 1), (3, 2), (4, 1), (5, 4), (6, 1), (6, 7)];
        let runs = plan(
            &flow(WorkflowKind::Dag, WorkflowState::Running),
            &tasks,
            &deps,
            TaskId(1),
        )
        .expect("a DAG is never refused");
        assert_eq!(runs, [(TaskId(1), 0), (TaskId(2), 1), (TaskId(3), 1)]);
        // Then the other dead parent: the task waiting for both comes back.
        let mut after = tasks.clone();
        after[0].1.status = Pending;
        after[1].1.status = Blocked;
        after[2].1.status = Blocked;
        let runs = plan(
            &flow(WorkflowKind::Dag, WorkflowState::Running),
            &after,
            &deps,
            TaskId(7),
        )
        .expect("a DAG is never refused");
        assert_eq!(runs, [(TaskId(7), 0), (TaskId(6), 2)]);
    }

    #[test]
    fn a_saga_runs_again_from_its_earliest_undone_step() {
        use TaskStatus::*;
        let mut tasks = [
            task(1, Succeeded, None),
            task(2, Succeeded, None),
            task(3, Dead, Some("boom")),
            task(4, Cancelled, BY_WORKFLOW),
        ];
        tasks[0].1.compensation = None; // compensation failed later: still done
        tasks[1].1.compensation = Some(CompensationState::Succeeded);
        tasks[2].1.compensation = Some(CompensationState::Succeeded);
        let deps = [(2, 1), (3, 2), (4, 3)];
        let saga = |state| flow(WorkflowKind::Saga, state);
        let runs = plan(&saga(WorkflowState::Compensated), &tasks, &deps, TaskId(3))
            .expect("a compensated saga can be retried");
        assert_eq!(runs, [(TaskId(3), 1), (TaskId(2), 0), (TaskId(4), 1)]);
        assert_eq!(
            plan(&saga(WorkflowState::Compensating), &tasks, &deps, TaskId(3)),
            Err("retry a step while its saga compensates")
        );
        // Nothing undone before it: the step alone, then the rest of the chain.
        tasks[1].1.compensation = None;
        let runs = plan(
            &saga(WorkflowState::CompensationFailed),
            &tasks,
            &deps,
            TaskId(3),
        )
        .expect("a saga whose compensation failed can be retried");
        assert_eq!(runs, [(TaskId(3), 0), (TaskId(4), 1)]);
    }
}
