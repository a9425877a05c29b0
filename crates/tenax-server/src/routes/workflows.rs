//! Workflow routes: enqueue a workflow (a DAG of tasks, or a saga), list workflows, and
//! show one with its tasks and their parents.
use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use tenax::storage::{
    WorkflowDetail, WorkflowKind, WorkflowListParams, WorkflowPolicy, WorkflowRecord,
};

use tenax::Workflow;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::model::*;
use crate::routes::secrets;
use crate::routes::tasks::{check_pressure, decode_cursor, encode_cursor, enqueue_of};
use crate::state::AppState;

/// Default and largest page of `GET /v1/workflows`.
const PAGE_DEFAULT: u32 = 50;
const PAGE_MAX: u32 = 500;

fn record_view(w: &WorkflowRecord) -> WorkflowView {
    WorkflowView {
        id: w.id,
        name: w.name.clone(),
        kind: w.kind.as_str().to_owned(),
        policy: w.policy.as_str().to_owned(),
        state: w.state.as_str().to_owned(),
        tasks: w.tasks(),
        by_status: w
            .by_status
            .iter()
            .map(|(s, n)| StatusCount {
                status: s.to_string(),
                count: *n,
            })
            .collect(),
        created_at: w.created_at,
        finished_at: w.finished_at,
    }
}

fn detail_view(state: &AppState, d: &WorkflowDetail) -> WorkflowDetailView {
    WorkflowDetailView {
        workflow: record_view(&d.workflow),
        tasks: d
            .tasks
            .iter()
            .map(|t| WorkflowTaskView {
                key: t.key.clone(),
                parents: t.parents.clone(),
                // Bounded as a list's tasks are: each large value is left out.
                task: secrets::task(state.config(), TaskView::listed(&t.task)),
            })
            .collect(),
    }
}

/// Enqueue a workflow in one transaction: every task exists afterwards, or none.
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows", request_body = WorkflowRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created, with its tasks", body = WorkflowDetailView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 409, description = "A task_no already exists (nothing enqueued)", body = ErrorBody),
        (status = 422, description = "Invalid field, unknown command type, unknown parent or a cycle (nothing enqueued)", body = ErrorBody),
        (status = 429, description = "A queue is full (Retry-After)", body = ErrorBody),
    ))]
pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<WorkflowRequest>,
) -> Result<(StatusCode, Json<WorkflowDetailView>), ApiError> {
    let kind = match req.kind.as_deref().unwrap_or("dag") {
        "dag" => WorkflowKind::Dag,
        "saga" => WorkflowKind::Saga,
        other => {
            return Err(ApiError::invalid(format!(
                "kind: must be dag or saga, got {:?}",
                other.chars().take(40).collect::<String>()
            ))
            .field("kind"))
        }
    };
    let policy = match req.policy.as_deref().unwrap_or("cancel_dependents") {
        "cancel_dependents" => WorkflowPolicy::CancelDependents,
        "run_anyway" => WorkflowPolicy::RunAnyway,
        other => {
            return Err(ApiError::invalid(format!(
                "policy: must be cancel_dependents or run_anyway, got {:?}",
                other.chars().take(40).collect::<String>()
            ))
            .field("policy"))
        }
    };
    let max = state.config().batch_max;
    if req.tasks.is_empty() || req.tasks.len() > max {
        return Err(ApiError::invalid(format!(
            "tasks: give 1 to {max} tasks, got {}",
            req.tasks.len()
        ))
        .field("tasks"));
    }
    let mut flow = match kind {
        WorkflowKind::Saga => Workflow::saga(req.name),
        WorkflowKind::Dag => Workflow::new(req.name),
    }
    .policy(policy);
    let mut previous: Option<String> = None;
    for (index, item) in req.tasks.into_iter().enumerate() {
        let after = match kind {
            // A saga's steps are a chain, in the order given.
            WorkflowKind::Saga if !item.after.is_empty() => {
                return Err(ApiError::invalid(format!(
                    "tasks[{index}].after: a saga's steps run in the order given; leave after empty"
                ))
                .field(format!("tasks[{index}].after")))
            }
            WorkflowKind::Saga => previous.iter().cloned().collect(),
            WorkflowKind::Dag => item.after,
        };
        previous = Some(item.key.clone());
        // The enqueue body sits under `task` in each item.
        let at = |e: ApiError| e.within("task").at(&format!("tasks[{index}]"));
        let mut task = enqueue_of(&state, item.task, caller.enqueuer(&state)).map_err(at)?;
        let params = task.params().map_err(|e| at(e.into()))?;
        check_pressure(&state, params).await?;
        flow = flow.task(item.key, task).after(after);
    }
    let detail = state.db(state.client().enqueue_workflow(flow)).await?;
    for t in &detail.tasks {
        state.inner.pending.bump(&t.task.queue);
    }
    Ok((StatusCode::CREATED, Json(detail_view(&state, &detail))))
}

/// Workflows newest first, a page at a time.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows", params(WorkflowListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page", body = WorkflowPage),
        (status = 400, description = "Bad cursor or query", body = ErrorBody),
        (status = 422, description = "Invalid limit", body = ErrorBody),
    ))]
pub(crate) async fn list(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<WorkflowListQuery>,
) -> Result<Json<WorkflowPage>, ApiError> {
    let limit = query.limit.unwrap_or(PAGE_DEFAULT);
    if limit == 0 || limit > PAGE_MAX {
        return Err(
            ApiError::invalid(format!("limit: must be 1 to {PAGE_MAX}, got {limit}"))
                .field("limit"),
        );
    }
    let before_id = query
        .cursor
        .as_deref()
        .map(decode_cursor)
        .transpose()?
        .map(|id| id.0);
    let params = WorkflowListParams { before_id, limit };
    let workflows = state.db(state.storage().workflow_list(&params)).await?;
    let next_cursor = (workflows.len() == limit as usize)
        .then(|| workflows.last().map(|w| encode_cursor(w.id)))
        .flatten();
    Ok(Json(WorkflowPage {
        workflows: workflows.iter().map(record_view).collect(),
        next_cursor,
    }))
}

/// A workflow with its tasks (in the order they were given) and their parents.
#[utoipa::path(get, path = "/v1/workflows/{id}", tag = "workflows",
    params(("id" = i64, Path, description = "Workflow id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The workflow", body = WorkflowDetailView),
        (status = 404, description = "No such workflow, or another's workflow to an enqueue token (the same answer)", body = ErrorBody),
    ))]
pub(crate) async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<WorkflowDetailView>, ApiError> {
    // An enqueue token reads a workflow whose every task it enqueued; another's is
    // answered as a missing one, word for word.
    match state.db(state.storage().workflow_get(id)).await? {
        Some(detail)
            if detail
                .tasks
                .iter()
                .all(|t| caller.may_read(t.task.created_by.as_deref())) =>
        {
            Ok(Json(detail_view(&state, &detail)))
        }
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "workflow_not_found",
            format!("workflow {id} not found"),
        )),
    }
}
