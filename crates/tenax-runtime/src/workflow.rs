//! Workflows from the library: the [`Workflow`] builder (dependencies and sagas), the
//! [`Client`] methods that enqueue and read workflows, and the source through which a
//! running task reads its parents' results.
use std::sync::Arc;

use tenax_core::{ParentResult, ParentSource, ParentsFuture, TaskId};
use tenax_storage::{
    Storage, TaskInsertParams, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowKind,
    WorkflowListParams, WorkflowPolicy, WorkflowRecord, WorkflowTaskParams,
};

use crate::client::{Client, Enqueue};
use crate::error::Error;

/// A group of tasks enqueued together, some waiting for others.
///
/// ```
/// # use tenax_core::{Command, CommandError, TaskContext};
/// # struct Ping;
/// # impl Command for Ping {
/// #     const TYPE: &'static str = "PING";
/// #     type Context = u32;
/// #     type Output = u32;
/// #     async fn execute(&self, n: u32, _: &TaskContext) -> Result<u32, CommandError> { Ok(n) }
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
/// use tenax_runtime::{Client, Workflow};
/// let client = Client::connect(&url).await?;
/// let flow = Workflow::new("report")
///     .task("left", client.enqueue::<Ping>(1))
///     .task("right", client.enqueue::<Ping>(2))
///     .task("sum", client.enqueue::<Ping>(3))
///     .after(["left", "right"]);
/// let detail = client.enqueue_workflow(flow).await?;
/// assert_eq!(detail.tasks[2].task.status, tenax_core::TaskStatus::Blocked);
/// # Ok::<(), tenax_runtime::Error>(())
/// # }).unwrap();
/// ```
#[derive(Debug)]
#[must_use = "a workflow does nothing until enqueued"]
pub struct Workflow {
    name: String,
    kind: WorkflowKind,
    policy: WorkflowPolicy,
    tasks: Vec<(String, Result<TaskInsertParams, Error>, Vec<String>)>,
}

impl Workflow {
    /// A workflow of tasks with dependencies (a DAG). By default a task that dies or is
    /// cancelled cancels its dependents ([`WorkflowPolicy::CancelDependents`]).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kind: WorkflowKind::Dag,
            policy: WorkflowPolicy::CancelDependents,
            tasks: Vec::new(),
        }
    }

    /// A saga: steps added with [`step`](Workflow::step) run in order; when one dies,
    /// it and the steps before it that succeeded are compensated in reverse order
    /// (their commands' `compensate`), one after another.
    pub fn saga(name: impl Into<String>) -> Self {
        Self {
            kind: WorkflowKind::Saga,
            ..Self::new(name)
        }
    }

    /// Add a task under `key` (unique in the workflow), built as for a single
    /// enqueue. It runs at once unless [`after`](Workflow::after) follows.
    pub fn task(mut self, key: impl Into<String>, task: Enqueue<'_>) -> Self {
        self.tasks
            .push((key.into(), task.into_params(), Vec::new()));
        self
    }

    /// The task added last waits until the tasks with these keys succeeded.
    pub fn after<I, S>(mut self, parents: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let Some((_, _, after)) = self.tasks.last_mut() {
            after.extend(parents.into_iter().map(Into::into));
        }
        self
    }

    /// Add the next step of a saga: it waits for the step before it.
    pub fn step(self, key: impl Into<String>, task: Enqueue<'_>) -> Self {
        let previous = self.tasks.last().map(|(k, _, _)| k.clone());
        let next = self.task(key, task);
        match previous {
            Some(previous) => next.after([previous]),
            None => next,
        }
    }

    /// What happens to a task's dependents when it dies or is cancelled.
    pub fn policy(mut self, policy: WorkflowPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The insert this builder makes, without making it: for the backends'
    /// `enqueue_workflow_in`, which inserts inside a transaction of the caller's.
    pub fn into_params(self) -> Result<WorkflowInsertParams, Error> {
        let tasks = self
            .tasks
            .into_iter()
            .map(|(key, task, after)| {
                Ok(WorkflowTaskParams {
                    key,
                    task: task?,
                    after,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(WorkflowInsertParams {
            name: self.name,
            kind: self.kind,
            policy: self.policy,
            tasks,
            now: None,
        })
    }
}

impl Client {
    /// Enqueue a workflow in one transaction: every task exists afterwards, or none.
    /// Cycles, unknown keys and numbers that exist already are refused (nothing is
    /// inserted then).
    pub async fn enqueue_workflow(&self, workflow: Workflow) -> Result<WorkflowDetail, Error> {
        let params = workflow.into_params()?;
        Ok(self.storage().workflow_insert(&params).await?)
    }

    /// A workflow with its tasks (their states and parents).
    pub async fn workflow(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>, Error> {
        Ok(self.storage().workflow_get(id).await?)
    }

    /// Workflows, newest first.
    pub async fn workflows(
        &self,
        params: &WorkflowListParams,
    ) -> Result<Vec<WorkflowRecord>, Error> {
        Ok(self.storage().workflow_list(params).await?)
    }
}

/// Reads a task's parents from the storage, for [`tenax_core::TaskContext::parent_results`].
pub(crate) struct StorageParents(pub(crate) Arc<dyn Storage>);

impl ParentSource for StorageParents {
    fn parents(&self, task: TaskId) -> ParentsFuture<'_> {
        Box::pin(async move {
            let parents = self
                .0
                .task_parent_results(task)
                .await
                .map_err(|e| e.to_string())?;
            Ok(parents
                .into_iter()
                .map(|p| ParentResult {
                    key: p.key,
                    task_no: p.task_no,
                    status: p.status,
                    output: p.result.and_then(|r| serde_json::from_str(&r).ok()),
                })
                .collect())
        })
    }
}
