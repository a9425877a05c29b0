//! Workflows: the parameters and records of
//! [`Storage::workflow_insert`](crate::Storage::workflow_insert) and its readers, and
//! the checks every backend makes before writing one (keys, references, cycles).
//!
//! A backend inserts a workflow in one transaction: the `tenax_workflows` row, its tasks
//! (a task with parents is `blocked` with `waiting_parents` = its parent count), and one
//! `tenax_task_deps` row per dependency. The transaction that finishes a parent then
//! moves its dependents (see [`WorkflowPolicy`]).
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use tenax_core::{InvalidInput, TaskNo, TaskRecord, TaskStatus};

use crate::common::validate_many;
use crate::error::Result;
use crate::params::TaskInsertParams;

/// The longest workflow name and task key, in bytes.
pub const WORKFLOW_NAME_MAX_BYTES: usize = 100;
/// The most tasks one workflow holds.
pub const WORKFLOW_MAX_TASKS: usize = 10_000;

/// The database id of a workflow.
pub type WorkflowId = i64;

/// What a workflow is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkflowKind {
    /// Tasks with dependencies: a task runs once all its parents succeeded.
    Dag,
    /// An ordered chain of steps: when step k dies, the steps before it that succeeded
    /// are compensated in reverse order, one after another.
    Saga,
}

impl WorkflowKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowKind::Dag => "dag",
            WorkflowKind::Saga => "saga",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "dag" => Some(WorkflowKind::Dag),
            "saga" => Some(WorkflowKind::Saga),
            _ => None,
        }
    }
}

/// What happens to a task's dependents when it dies or is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkflowPolicy {
    /// Its dependents (and theirs, transitively) are cancelled in the same transaction.
    #[default]
    CancelDependents,
    /// Its dependents still run, once every one of their parents has finished.
    RunAnyway,
}

impl WorkflowPolicy {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowPolicy::CancelDependents => "cancel_dependents",
            WorkflowPolicy::RunAnyway => "run_anyway",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "cancel_dependents" => Some(WorkflowPolicy::CancelDependents),
            "run_anyway" => Some(WorkflowPolicy::RunAnyway),
            _ => None,
        }
    }
}

/// Where a workflow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkflowState {
    /// Some task has not finished.
    Running,
    /// A DAG whose tasks all succeeded.
    Succeeded,
    /// A DAG whose tasks all finished, not all of them successfully.
    Failed,
    /// A saga step died; the steps before it are being compensated.
    Compensating,
    /// A saga whose steps all succeeded.
    Completed,
    /// A saga whose failed run was compensated (every compensation finished).
    Compensated,
    /// A saga in which a compensation died: someone must look.
    CompensationFailed,
}

impl WorkflowState {
    /// The name shown and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowState::Running => "running",
            WorkflowState::Succeeded => "succeeded",
            WorkflowState::Failed => "failed",
            WorkflowState::Compensating => "compensating",
            WorkflowState::Completed => "completed",
            WorkflowState::Compensated => "compensated",
            WorkflowState::CompensationFailed => "compensation_failed",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [
            WorkflowState::Running,
            WorkflowState::Succeeded,
            WorkflowState::Failed,
            WorkflowState::Compensating,
            WorkflowState::Completed,
            WorkflowState::Compensated,
            WorkflowState::CompensationFailed,
        ]
        .into_iter()
        .find(|state| state.as_str() == s)
    }

    /// Whether the workflow is over.
    pub fn is_finished(self) -> bool {
        !matches!(self, WorkflowState::Running | WorkflowState::Compensating)
    }
}

impl std::fmt::Display for WorkflowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task of a workflow to insert.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowTaskParams {
    /// The task's name in the workflow, unique in it (1 to 100 bytes).
    pub key: String,
    /// The task (its `task_no` must be new).
    pub task: TaskInsertParams,
    /// The keys of the tasks it waits for.
    pub after: Vec<String>,
}

/// [`Storage::workflow_insert`](crate::Storage::workflow_insert).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowInsertParams {
    /// A name for people (1 to 100 bytes; need not be unique).
    pub name: String,
    /// DAG or saga. A saga's steps are a chain: each waits for the one before.
    pub kind: WorkflowKind,
    /// What a task that dies or is cancelled does to its dependents.
    pub policy: WorkflowPolicy,
    /// The tasks, at most [`WORKFLOW_MAX_TASKS`].
    pub tasks: Vec<WorkflowTaskParams>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// A workflow as stored, with its status read from its tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowRecord {
    /// Its id.
    pub id: WorkflowId,
    /// Its name.
    pub name: String,
    /// DAG or saga.
    pub kind: WorkflowKind,
    /// Its policy.
    pub policy: WorkflowPolicy,
    /// Where it stands.
    pub state: WorkflowState,
    /// Its tasks by status.
    pub by_status: Vec<(TaskStatus, u64)>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it finished (its last task finished, or a saga's state was decided).
    pub finished_at: Option<DateTime<Utc>>,
}

impl WorkflowRecord {
    /// Its number of tasks.
    pub fn tasks(&self) -> u64 {
        self.by_status.iter().map(|(_, n)| n).sum()
    }
}

/// One task of a workflow, as [`Storage::workflow_get`](crate::Storage::workflow_get)
/// reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowTask {
    /// Its key in the workflow.
    pub key: String,
    /// The task.
    pub task: TaskRecord,
    /// The keys of its parents.
    pub parents: Vec<String>,
}

/// A workflow and its tasks, in insertion order.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowDetail {
    /// The workflow.
    pub workflow: WorkflowRecord,
    /// Its tasks.
    pub tasks: Vec<WorkflowTask>,
}

/// [`Storage::workflow_list`](crate::Storage::workflow_list).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkflowListParams {
    /// Only ids below this one (newest-first pages).
    pub before_id: Option<WorkflowId>,
    /// At most this many, newest first.
    pub limit: u32,
}

/// A parent's outcome, as a child reads it
/// ([`Storage::task_parent_results`](crate::Storage::task_parent_results)).
#[derive(Debug, Clone, PartialEq)]
pub struct ParentOutcome {
    /// The parent's key in the workflow.
    pub key: String,
    /// Its number.
    pub task_no: TaskNo,
    /// Its status (`succeeded` unless the workflow runs dependents anyway).
    pub status: TaskStatus,
    /// Its result, as JSON text.
    pub result: Option<String>,
}

/// A workflow checked and ready to insert: its tasks, and per task the indexes of its
/// parents.
pub(crate) struct CheckedWorkflow {
    pub(crate) tasks: Vec<TaskInsertParams>,
    pub(crate) parents: Vec<Vec<usize>>,
}

fn refuse(reason: String) -> crate::StorageError {
    InvalidInput::new("workflow", reason).into()
}

/// Check a workflow before any write: name, keys (unique), references (known, not to
/// itself), `task_no`s (unique), no cycle, a saga's chain, and every task as a single
/// insert would.
pub(crate) fn check_workflow(params: &WorkflowInsertParams) -> Result<CheckedWorkflow> {
    let name = &params.name;
    if name.is_empty() || name.len() > WORKFLOW_NAME_MAX_BYTES || name.chars().any(char::is_control)
    {
        return Err(refuse(format!(
            "name must be 1 to {WORKFLOW_NAME_MAX_BYTES} bytes without control characters"
        )));
    }
    if params.tasks.is_empty() || params.tasks.len() > WORKFLOW_MAX_TASKS {
        return Err(refuse(format!(
            "must have 1 to {WORKFLOW_MAX_TASKS} tasks, has {}",
            params.tasks.len()
        )));
    }
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut numbers: HashMap<&str, &str> = HashMap::new();
    for (i, t) in params.tasks.iter().enumerate() {
        if t.key.is_empty()
            || t.key.len() > WORKFLOW_NAME_MAX_BYTES
            || t.key.chars().any(char::is_control)
        {
            return Err(refuse(format!(
                "task key {:?} must be 1 to {WORKFLOW_NAME_MAX_BYTES} bytes without control characters",
                t.key
            )));
        }
        if index.insert(t.key.as_str(), i).is_some() {
            return Err(refuse(format!("task key {:?} is used twice", t.key)));
        }
        if let Some(other) = numbers.insert(t.task.task_no.as_str(), t.key.as_str()) {
            return Err(refuse(format!(
                "tasks {other:?} and {:?} have the same task_no {}",
                t.key, t.task.task_no
            )));
        }
    }
    let mut parents = Vec::with_capacity(params.tasks.len());
    for t in &params.tasks {
        let mut mine = Vec::with_capacity(t.after.len());
        for parent in &t.after {
            let Some(&p) = index.get(parent.as_str()) else {
                return Err(refuse(format!(
                    "task {:?} waits for {parent:?}, which is not in the workflow",
                    t.key
                )));
            };
            if parent == &t.key {
                return Err(refuse(format!("task {:?} waits for itself", t.key)));
            }
            if !mine.contains(&p) {
                mine.push(p);
            }
        }
        parents.push(mine);
    }
    if let Some(cycle) = find_cycle(&parents) {
        let path: Vec<&str> = cycle
            .iter()
            .map(|&i| params.tasks[i].key.as_str())
            .collect();
        return Err(refuse(format!(
            "tasks form a cycle: {} (each waits for the next)",
            path.join(" → ")
        )));
    }
    if params.kind == WorkflowKind::Saga {
        for (i, mine) in parents.iter().enumerate() {
            let chained = if i == 0 {
                mine.is_empty()
            } else {
                mine.as_slice() == [i - 1]
            };
            if !chained {
                return Err(refuse(format!(
                    "saga step {:?} must wait for exactly the step before it",
                    params.tasks[i].key
                )));
            }
        }
    }
    let tasks: Vec<TaskInsertParams> = params.tasks.iter().map(|t| t.task.clone()).collect();
    validate_many(&tasks)?;
    Ok(CheckedWorkflow { tasks, parents })
}

/// A cycle in the "waits for" graph, as a path of task indexes that starts and ends at
/// the same task, or `None`. Iterative depth-first search (no recursion depth limit).
fn find_cycle(parents: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let mut mark = vec![Mark::New; parents.len()];
    for start in 0..parents.len() {
        if mark[start] != Mark::New {
            continue;
        }
        // (node, next parent to visit)
        let mut stack = vec![(start, 0usize)];
        mark[start] = Mark::Open;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&parent) = parents[node].get(*next) {
                *next += 1;
                match mark[parent] {
                    Mark::New => {
                        mark[parent] = Mark::Open;
                        stack.push((parent, 0));
                    }
                    Mark::Open => {
                        let from = stack.iter().position(|(n, _)| *n == parent)?;
                        let mut path: Vec<usize> = stack[from..].iter().map(|(n, _)| *n).collect();
                        path.push(parent);
                        return Some(path);
                    }
                    Mark::Done => {}
                }
            } else {
                mark[node] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

/// The status a workflow shows: a saga's stored state once decided, otherwise read
/// from its tasks' counts.
pub(crate) fn derive_state(
    stored: WorkflowState,
    kind: WorkflowKind,
    by_status: &[(TaskStatus, u64)],
) -> WorkflowState {
    if kind == WorkflowKind::Saga {
        return stored;
    }
    let unfinished = by_status
        .iter()
        .filter(|(s, _)| !s.is_finished())
        .map(|(_, n)| n)
        .sum::<u64>();
    if unfinished > 0 {
        WorkflowState::Running
    } else if by_status
        .iter()
        .all(|(s, n)| *s == TaskStatus::Succeeded || *n == 0)
    {
        WorkflowState::Succeeded
    } else {
        WorkflowState::Failed
    }
}

/// A `tenax_workflows` row as a backend reads it.
pub(crate) struct WorkflowRow {
    pub(crate) id: WorkflowId,
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) policy: String,
    pub(crate) state: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) finished_at: Option<DateTime<Utc>>,
}

/// Per status of a workflow's tasks: how many, and the latest `finished_at`.
pub(crate) type StatusCount = (TaskStatus, u64, Option<DateTime<Utc>>);

/// A workflow record from its row and its tasks' counts.
pub(crate) fn assemble(row: WorkflowRow, counts: &[StatusCount]) -> Result<WorkflowRecord> {
    let corrupt = |what: &str, value: &str| {
        crate::StorageError::Corrupt(format!("workflow {}: {what} = {value:?}", row.id))
    };
    let kind = WorkflowKind::parse(&row.kind).ok_or_else(|| corrupt("kind", &row.kind))?;
    let policy =
        WorkflowPolicy::parse(&row.policy).ok_or_else(|| corrupt("policy", &row.policy))?;
    let stored = WorkflowState::parse(&row.state).ok_or_else(|| corrupt("state", &row.state))?;
    let by_status: Vec<(TaskStatus, u64)> = TaskStatus::ALL
        .iter()
        .filter_map(|s| {
            let n: u64 = counts.iter().filter(|c| c.0 == *s).map(|c| c.1).sum();
            (n > 0).then_some((*s, n))
        })
        .collect();
    let state = derive_state(stored, kind, &by_status);
    let finished_at = match kind {
        WorkflowKind::Saga => row.finished_at,
        WorkflowKind::Dag if state.is_finished() => counts.iter().filter_map(|c| c.2).max(),
        WorkflowKind::Dag => None,
    };
    Ok(WorkflowRecord {
        id: row.id,
        name: row.name,
        kind,
        policy,
        state,
        by_status,
        created_at: row.created_at,
        finished_at,
    })
}

/// The detail of a workflow from its record, its tasks (with their keys, in id order)
/// and its dependencies `(child, parent)` by task id.
pub(crate) fn detail(
    workflow: WorkflowRecord,
    tasks: Vec<(String, TaskRecord)>,
    deps: &[(i64, i64)],
) -> WorkflowDetail {
    let keys: HashMap<i64, String> = tasks
        .iter()
        .map(|(key, task)| (task.id.0, key.clone()))
        .collect();
    let tasks = tasks
        .into_iter()
        .map(|(key, task)| {
            let mut parents: Vec<(i64, String)> = deps
                .iter()
                .filter(|(child, _)| *child == task.id.0)
                .filter_map(|(_, parent)| keys.get(parent).map(|k| (*parent, k.clone())))
                .collect();
            parents.sort();
            WorkflowTask {
                key,
                task,
                parents: parents.into_iter().map(|(_, k)| k).collect(),
            }
        })
        .collect();
    WorkflowDetail { workflow, tasks }
}

/// The tasks a workflow insert made, or a refusal when one of its numbers existed.
pub(crate) fn created_tasks(
    params: &WorkflowInsertParams,
    outcomes: Vec<crate::TaskInsertOutcome>,
) -> Result<Vec<(String, TaskRecord)>> {
    params
        .tasks
        .iter()
        .zip(outcomes)
        .map(|(t, outcome)| match outcome {
            crate::TaskInsertOutcome::Created(task) => Ok((t.key.clone(), task)),
            other => Err(refuse(format!(
                "task {:?}: task_no {} already exists (task #{}); a workflow's tasks must be new",
                t.key,
                t.task.task_no,
                other.task().id
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::find_cycle;

    #[test]
    fn cycles_are_found_with_their_path() {
        assert_eq!(find_cycle(&[vec![], vec![0], vec![0, 1]]), None);
        assert_eq!(
            find_cycle(&[vec![2], vec![0], vec![1]]),
            Some(vec![0, 2, 1, 0])
        );
        assert_eq!(find_cycle(&[vec![], vec![1]]), Some(vec![1, 1]));
        // A long chain does not overflow anything.
        let chain: Vec<Vec<usize>> = (0..100_000)
            .map(|i| if i == 0 { vec![] } else { vec![i - 1] })
            .collect();
        assert_eq!(find_cycle(&chain), None);
    }
}
