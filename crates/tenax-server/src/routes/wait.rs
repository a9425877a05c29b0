//! `GET /v1/tasks/{id}/wait`: the long-poll for a task's final status. Where the backend
//! pushes finishes (PostgreSQL), a wait registers and is woken by its task's finish;
//! elsewhere it reads the task with a growing pause.
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use tenax::storage::{FinishHint, FinishReceiver, Storage, TaskRef};
use tenax::{TaskId, TaskStatus};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::model::*;
use crate::routes::tasks::find;
use crate::state::AppState;

/// Default wait of a long-poll.
const WAIT_DEFAULT: Duration = Duration::from_secs(30);

/// Wait until a task reaches a final status, or the timeout passes.
#[utoipa::path(get, path = "/v1/tasks/{id}/wait", tag = "tasks",
    params(("id" = i64, Path, description = "Task id"), WaitQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The task reached a final status", body = WaitResponse),
        (status = 202, description = "The wait timed out; the task as it stands (finished = false)", body = WaitResponse),
        (status = 404, description = "No such task, or another's task to an enqueue token (the same answer)", body = ErrorBody),
    ))]
pub(crate) async fn wait(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
    ApiQuery(query): ApiQuery<WaitQuery>,
) -> Result<(StatusCode, Json<WaitResponse>), ApiError> {
    let timeout = query
        .timeout_ms
        .map_or(WAIT_DEFAULT, Duration::from_millis)
        .min(state.config().wait_max);
    let deadline = tokio::time::Instant::now() + timeout;
    let storage = state.storage().clone();
    // Where the backend pushes finishes, a wait of an unfinished task listens, then
    // registers (the registration waits for a finish in flight to commit), then reads
    // again: a finish is either seen by that read or heard.
    let mut finishes = None;
    // Held to the end of the request: its drop ends the registration.
    let mut _registration: Option<WaitEnd> = None;
    let mut may_register = true;
    let mut pause = Duration::from_millis(20);
    loop {
        let task = find(&state, &caller, TaskRef::Id(TaskId(id))).await?;
        let finished = task
            .status
            .parse::<TaskStatus>()
            .is_ok_and(TaskStatus::is_finished);
        let now = tokio::time::Instant::now();
        if finished || now >= deadline || state.inner.shutdown.is_cancelled() {
            let status = if finished {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            return Ok((status, Json(WaitResponse { finished, task })));
        }
        if std::mem::take(&mut may_register) {
            if let Some(hints) = storage.finishes() {
                match storage.task_wait_begin(TaskId(id)).await {
                    Ok(Some(waiter)) => {
                        _registration = Some(WaitEnd {
                            storage: storage.clone(),
                            waiter,
                        });
                        finishes = Some(hints);
                        continue;
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, task = id, "registering a wait failed; polling");
                    }
                }
            }
        }
        let left = deadline - now;
        match finishes.as_mut() {
            // Woken by the finish; read again now and then in case a hint is lost.
            Some(hints) => tokio::select! {
                () = finish_of(hints, TaskId(id)) => {}
                _ = tokio::time::sleep(WAIT_RECHECK.min(left)) => {}
                _ = state.inner.shutdown.cancelled() => {}
            },
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(pause.min(left)) => {}
                    _ = state.inner.shutdown.cancelled() => {}
                }
                pause = (pause * 2).min(Duration::from_millis(250));
            }
        }
    }
}

/// How often a wait woken by finishes reads its task anyway.
const WAIT_RECHECK: Duration = Duration::from_secs(5);

/// Until a hint names `task`, or says hints were lost.
async fn finish_of(hints: &mut FinishReceiver, task: TaskId) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        match hints.recv().await {
            Ok(FinishHint::Task(id)) if id != task => {}
            Ok(_) | Err(RecvError::Lagged(_)) => return,
            // The listener is gone: only the recheck wakes this wait now.
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

/// Ends a registered wait however the request ends (an answer, an error, a client
/// that went away).
struct WaitEnd {
    storage: std::sync::Arc<dyn Storage>,
    waiter: String,
}

impl Drop for WaitEnd {
    fn drop(&mut self) {
        let storage = self.storage.clone();
        let waiter = std::mem::take(&mut self.waiter);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = storage.task_wait_end(&waiter).await {
                    tracing::warn!(error = %e, "ending a wait failed; its row goes within an hour");
                }
            });
        }
    }
}
