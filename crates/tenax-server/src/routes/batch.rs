//! `POST /v1/tasks/batch`: many tasks checked first, then enqueued in one transaction,
//! each answered as a single enqueue would be, or, with `atomic`, all or none.
use std::collections::{HashMap, HashSet};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use tenax::storage::{validate_insert, TaskInsertOutcome, TaskInsertParams};
use tenax::{Enqueue, TaskRecord};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::model::*;
use crate::routes::secrets;
use crate::routes::tasks::*;
use crate::state::AppState;

/// Enqueue many tasks in one transaction; each gets the outcome a single enqueue would
/// have had, or, with `atomic`, either every task is enqueued or none is.
#[utoipa::path(post, path = "/v1/tasks/batch", tag = "tasks", request_body = BatchRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One outcome per task, in request order: 201 created, 200 the existing task of a repeated task_no, or the error a single enqueue of it would have answered (the tasks that passed were enqueued together)", body = BatchResponse),
        (status = 400, description = "Malformed JSON (nothing enqueued)", body = ErrorBody),
        (status = 413, description = "Body over the limit (nothing enqueued)", body = ErrorBody),
        (status = 422, description = "No tasks or more than batch_max (`invalid_input`), or, with `atomic`, a task that cannot be enqueued (`batch_refused`, each such task named in `items`): nothing enqueued", body = BatchRefusedBody),
        (status = 503, description = "Database unavailable: nothing enqueued (Retry-After)", body = ErrorBody),
    ))]
pub(crate) async fn enqueue_batch(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<BatchRequest>,
) -> Result<Response, ApiError> {
    let max = state.config().batch_max;
    let count = req.tasks.len();
    if count == 0 || count > max {
        return Err(
            ApiError::invalid(format!("tasks: give 1 to {max} tasks, got {count}")).field("tasks"),
        );
    }
    // Every task is checked before anything is written; `answers[i]` is task i's
    // outcome once known.
    let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
    let created_by = caller.enqueuer(&state);
    let mut positions = Vec::with_capacity(count);
    let mut tasks = Vec::with_capacity(count);
    for (index, item) in req.tasks.into_iter().enumerate() {
        match batch_task(&state, item, created_by.clone()) {
            Ok(task) => {
                positions.push(index);
                tasks.push(task);
            }
            Err(e) => answers[index] = Some(Err(e)),
        }
    }
    let refused = {
        let views = tasks
            .iter_mut()
            .map(Enqueue::params)
            .collect::<Result<Vec<_>, _>>()?;
        batch_pressure(&state, &views).await?
    };
    if refused.iter().any(Option::is_some) {
        let mut kept_positions = Vec::with_capacity(tasks.len());
        let mut kept = Vec::with_capacity(tasks.len());
        for ((index, task), refusal) in positions.into_iter().zip(tasks).zip(refused) {
            match refusal {
                Some(e) => answers[index] = Some(Err(e)),
                None => {
                    kept_positions.push(index);
                    kept.push(task);
                }
            }
        }
        positions = kept_positions;
        tasks = kept;
    }
    if req.atomic && answers.iter().any(Option::is_some) {
        return Ok(batch_refused(answers));
    }
    if !tasks.is_empty() {
        let outcomes = if req.atomic {
            let accept =
                |outcomes: &[TaskInsertOutcome]| outcomes.iter().all(|o| passes(&caller, o));
            let checked = state
                .db(state.client().enqueue_many_if(tasks, accept))
                .await?;
            if !checked.committed {
                for (index, outcome) in positions.iter().zip(checked.outcomes) {
                    if !passes(&caller, &outcome) {
                        answers[*index] = Some(outcome_answer(&caller, outcome));
                    }
                }
                return Ok(batch_refused(answers));
            }
            checked.outcomes
        } else {
            state.db(state.client().enqueue_many(tasks)).await?
        };
        if outcomes.len() != positions.len() {
            tracing::error!(
                tasks = positions.len(),
                outcomes = outcomes.len(),
                "a bulk insert answered another number of outcomes than tasks"
            );
            return Err(ApiError::for_status(StatusCode::INTERNAL_SERVER_ERROR));
        }
        for (index, outcome) in positions.iter().zip(outcomes) {
            if outcome.created() {
                state.inner.pending.bump(&outcome.task().queue);
            }
            answers[*index] = Some(outcome_answer(&caller, outcome));
        }
    }
    let results = answers
        .into_iter()
        .enumerate()
        .map(|(index, answer)| match answer {
            Some(Ok((created, task))) => BatchItem {
                index,
                status: if created { 201 } else { 200 },
                task: Some(secrets::task(state.config(), TaskView::from_record(&task))),
                error: None,
            },
            Some(Err(e)) => {
                let e = e.within(&format!("tasks[{index}]"));
                BatchItem {
                    index,
                    status: e.status.as_u16(),
                    task: None,
                    error: Some(ErrorDetail {
                        code: e.code.to_owned(),
                        field: e.field,
                        message: e.message,
                    }),
                }
            }
            // Every task is answered above: validated, refused, or inserted.
            None => BatchItem {
                index,
                status: 500,
                task: None,
                error: Some(ErrorDetail {
                    code: "internal".to_owned(),
                    field: Some(format!("tasks[{index}]")),
                    message: "internal error; see the server log".to_owned(),
                }),
            },
        })
        .collect();
    Ok(Json(BatchResponse { results }).into_response())
}

/// One task's outcome in a batch: the task and whether it is new, or the error a single
/// enqueue of it would have answered.
type Answer = Result<(bool, TaskRecord), ApiError>;

/// A batch task's enqueue, under the caller's name, with every check a single enqueue
/// makes before the database: the request's and the store's (so that a task the store
/// would refuse is answered alone instead of refusing the whole batch).
fn batch_task(
    state: &AppState,
    req: EnqueueRequest,
    created_by: Option<String>,
) -> Result<Enqueue<'_>, ApiError> {
    let mut task = enqueue_of(state, req, created_by)?;
    validate_insert(task.params()?)?;
    Ok(task)
}

/// Back-pressure for a batch, in request order: in each queue with a maximum, the tasks
/// that fit under it pass, counted as if each were new; a task beyond it passes only if
/// its number exists (it is that task) or repeats a task of the batch that passed.
/// Returns, per task, the 429 of a refused one.
async fn batch_pressure(
    state: &AppState,
    tasks: &[&TaskInsertParams],
) -> Result<Vec<Option<ApiError>>, ApiError> {
    let mut refused: Vec<Option<ApiError>> = (0..tasks.len()).map(|_| None).collect();
    if state
        .config()
        .queues
        .values()
        .all(|q| q.max_pending.is_none())
    {
        return Ok(refused);
    }
    let mut pending: HashMap<&str, u64> = HashMap::new();
    let mut passed: HashSet<&str> = HashSet::new();
    for (i, task) in tasks.iter().enumerate() {
        let Some(max) = max_pending(state, &task.queue) else {
            continue;
        };
        let waiting = match pending.get_mut(task.queue.as_str()) {
            Some(n) => n,
            None => {
                let n = pending_count(state, &task.queue).await?;
                pending.entry(task.queue.as_str()).or_insert(n)
            }
        };
        let no = task.task_no.as_str();
        if passed.contains(no) {
            continue;
        }
        if *waiting < max {
            *waiting += 1;
            passed.insert(no);
            continue;
        }
        let full = queue_full(&task.queue, *waiting, max);
        if number_exists(state, &task.task_no).await? {
            passed.insert(no);
        } else {
            refused[i] = Some(full);
        }
    }
    Ok(refused)
}

/// Whether an item of a bulk insert is enqueued for this caller: a new task, or an
/// existing one it may read.
fn passes(caller: &Caller, outcome: &TaskInsertOutcome) -> bool {
    match outcome {
        TaskInsertOutcome::Created(_) => true,
        TaskInsertOutcome::Existing(task) => caller.may_read(task.created_by.as_deref()),
        TaskInsertOutcome::Conflict { .. } => false,
    }
}

/// What a single enqueue would have answered this caller for an item of a bulk insert
/// (see [`enqueue_one`]).
fn outcome_answer(caller: &Caller, outcome: TaskInsertOutcome) -> Answer {
    if !outcome.created() && !caller.may_read(outcome.task().created_by.as_deref()) {
        // Whether another's task has this type and payload is not the caller's to learn.
        return Err(number_taken(&outcome.task().task_no));
    }
    let inserted = outcome.into_inserted()?;
    Ok((inserted.created, inserted.task))
}

/// The 422 of an atomic batch that enqueued nothing, naming each task at fault.
fn batch_refused(answers: Vec<Option<Answer>>) -> Response {
    let count = answers.len();
    let items: Vec<BatchItemError> = answers
        .into_iter()
        .enumerate()
        .filter_map(|(index, answer)| match answer {
            Some(Err(e)) => {
                let place = format!("tasks[{index}]");
                let e = e.within(&place);
                Some(BatchItemError {
                    index,
                    status: e.status.as_u16(),
                    code: e.code.to_owned(),
                    field: e.field.unwrap_or(place),
                    message: e.message,
                })
            }
            _ => None,
        })
        .collect();
    let body = BatchRefusedBody {
        error: BatchRefused {
            code: "batch_refused".to_owned(),
            field: Some("tasks".to_owned()),
            message: format!(
                "{} of {count} tasks cannot be enqueued; nothing was enqueued",
                items.len()
            ),
            items,
        },
    };
    (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
}
