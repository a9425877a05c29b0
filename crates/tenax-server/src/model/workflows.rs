//! The shapes of the workflow routes (`/v1/workflows`).
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{EnqueueRequest, StatusCount, TaskView};

/// One task of a workflow to enqueue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkflowTaskRequest {
    /// Its name in the workflow, unique in it (1 to 100 bytes).
    pub key: String,
    /// The keys of the tasks it waits for (DAG only; a saga's steps are a chain).
    #[serde(default)]
    pub after: Vec<String>,
    /// The task, as for `POST /v1/tasks`.
    pub task: EnqueueRequest,
}

/// A workflow to enqueue: a DAG of tasks, or a saga whose steps run in order and are
/// compensated in reverse order when one dies.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "order 7", "kind": "dag", "tasks": [
    {"key": "lock", "task": {"command_type": "echo", "payload": {"step": "lock"}}},
    {"key": "pay", "after": ["lock"], "task": {"command_type": "echo", "payload": {"step": "pay"}}}
]}))]
pub struct WorkflowRequest {
    /// A name for people (1 to 100 bytes).
    pub name: String,
    /// `dag` (default) or `saga`.
    pub kind: Option<String>,
    /// What a task that dies or is cancelled does to its dependents:
    /// `cancel_dependents` (default) or `run_anyway`.
    pub policy: Option<String>,
    /// The tasks, at most `batch_max` (default 1,000).
    pub tasks: Vec<WorkflowTaskRequest>,
}

/// A workflow and where it stands.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowView {
    /// Its id.
    pub id: i64,
    /// Its name.
    pub name: String,
    /// `dag` or `saga`.
    pub kind: String,
    /// `cancel_dependents` or `run_anyway`.
    pub policy: String,
    /// `running`, `succeeded`, `failed`, `compensating`, `completed`, `compensated` or
    /// `compensation_failed`.
    pub state: String,
    /// Its number of tasks.
    pub tasks: u64,
    /// Its tasks by status.
    pub by_status: Vec<StatusCount>,
    /// Enqueued (UTC).
    pub created_at: DateTime<Utc>,
    /// Finished (UTC).
    pub finished_at: Option<DateTime<Utc>>,
}

/// A task of a workflow, with the keys of its parents.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowTaskView {
    /// Its key in the workflow.
    pub key: String,
    /// The keys of the tasks it waits for.
    pub parents: Vec<String>,
    /// The task.
    pub task: TaskView,
}

/// A workflow with its tasks.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowDetailView {
    /// The workflow.
    pub workflow: WorkflowView,
    /// Its tasks, in the order they were given.
    pub tasks: Vec<WorkflowTaskView>,
}

/// A page of workflows, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowPage {
    /// The workflows.
    pub workflows: Vec<WorkflowView>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// Paging of `GET /v1/workflows`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WorkflowListQuery {
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}
