//! The shapes of `POST /v1/tasks/batch`: several tasks in one request.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{EnqueueRequest, ErrorDetail, TaskView};

/// Several tasks to enqueue in one request, in one transaction. Each task gets its own
/// outcome; with `atomic`, either every task is enqueued or none is.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tasks": [{"command_type": "echo", "payload": {"n": 1}}, {"command_type": "echo", "payload": {"n": 2}, "task_no": "n-2"}]}))]
pub struct BatchRequest {
    /// The tasks, 1 to `batch_max` (default 1,000).
    pub tasks: Vec<EnqueueRequest>,
    /// All or nothing (default `false`). With `true`, a task that would not be enqueued
    /// (invalid, refused, conflicting, its queue full) refuses the whole batch: nothing
    /// is written and the answer is 422 `batch_refused`, naming each such task. A
    /// repeat of an existing task (same `task_no`, type and payload) is not a failure:
    /// it answers 200 with that task, so an atomic batch can be sent again safely.
    #[serde(default)]
    pub atomic: bool,
}

/// One task's outcome in a batch.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchItem {
    /// Position in the request.
    pub index: usize,
    /// The status a single enqueue would have answered (201, 200, 409, 413, 422, 429).
    pub status: u16,
    /// The task, when stored or found.
    pub task: Option<TaskView>,
    /// The error, otherwise.
    pub error: Option<ErrorDetail>,
}

/// Outcomes of a batch, in request order.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"results": [{"index": 0, "status": 422, "task": null, "error": {"code": "unknown_command_type", "message": "command type \"nope\" is not accepted by this server"}}]}))]
pub struct BatchResponse {
    /// One per requested task.
    pub results: Vec<BatchItem>,
}

/// The 422 of a batch that enqueued nothing: the error shape, with the tasks at fault
/// when an atomic batch was refused for them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"error": {
    "code": "batch_refused", "field": "tasks",
    "message": "1 of 3 tasks cannot be enqueued; nothing was enqueued",
    "items": [{"index": 2, "status": 422, "code": "invalid_input", "field": "tasks[2].priority", "message": "priority: must be 0 to 9, got 12"}]
}}))]
pub struct BatchRefusedBody {
    /// The error: code `batch_refused`, field `tasks`.
    pub error: BatchRefused,
}

/// Why a batch enqueued nothing: the error shape of every answer, with `items` when the
/// code is `batch_refused`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchRefused {
    /// `batch_refused` (an atomic batch with a task that cannot be enqueued), or the
    /// code of a refusal of the request as a whole (`invalid_input` for no tasks or
    /// more than `batch_max`).
    pub code: String,
    /// `tasks`, or the request field at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What went wrong, for people.
    pub message: String,
    /// With `batch_refused`: each task that cannot be enqueued, in request order (the
    /// others could have been). Absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<BatchItemError>,
}

/// One task of a refused atomic batch: where it is and what is wrong with it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchItemError {
    /// Position in the request.
    pub index: usize,
    /// The status a single enqueue of this task would have answered (409, 413, 422,
    /// 429). A 429 (its queue is full) may pass later.
    pub status: u16,
    /// Stable snake_case code, as for a single enqueue.
    pub code: String,
    /// The request field at fault: `tasks[3]` or a field under it (`tasks[3].priority`).
    pub field: String,
    /// What went wrong.
    pub message: String,
}
