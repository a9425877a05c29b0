//! Task routes: enqueue (one; many in `batch.rs`), list, get, attempts, wait, cancel,
//! retry.
use std::future::IntoFuture;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use tenax::storage::{
    TaskActionParams, TaskInsertParams, TaskListParams, TaskRef, MAX_DELAY, PAYLOAD_MAX_BYTES,
};
use tenax::{Enqueue, QueueName, TaskId, TaskNo, TaskRecord, TaskStatus};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::model::*;
use crate::routes::{admin::record, secrets};
use crate::state::AppState;

/// Default and largest page of `GET /v1/tasks`.
const PAGE_DEFAULT: u32 = 50;
const PAGE_MAX: u32 = 500;

pub(crate) fn in_range(
    field: &str,
    value: Option<i64>,
    min: i64,
    max: i64,
    default: i64,
) -> Result<i64, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if (min..=max).contains(&v) => Ok(v),
        Some(v) => {
            Err(ApiError::invalid(format!("{field}: must be {min} to {max}, got {v}")).field(field))
        }
    }
}

pub(crate) fn check_command_type(state: &AppState, command_type: &str) -> Result<(), ApiError> {
    if state.config().command_types.contains(command_type) {
        return Ok(());
    }
    let shown: String = command_type.chars().take(100).collect();
    Err(ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown_command_type",
        format!(
            "command type {shown:?} is not accepted by this server (accepted: {})",
            state
                .config()
                .command_types
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .field("command_type"))
}

/// Refuse a `callback_url` outside the allow-list, an `http` task naming a target the
/// deployment does not declare, and an `http` task whose path could leave its target.
pub(crate) fn check_outbound(state: &AppState, req: &EnqueueRequest) -> Result<(), ApiError> {
    if let Some(url) = &req.callback_url {
        let allow = tenax_core::outbound::HostAllowList::new(
            state.config().callback_allow_hosts.iter().cloned(),
        );
        if let Err(refused) = allow.check(url) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "callback_url_refused",
                format!("callback_url: {refused}"),
            )
            .field("callback_url"));
        }
    }
    check_kind_payload(state, &req.command_type, &req.payload)
}

/// What can be known at enqueue of a task (or schedule) of a built-in kind: an `http`
/// task's target and path, an `exec` task's program and arguments.
pub(crate) fn check_kind_payload(
    state: &AppState,
    command_type: &str,
    payload: &serde_json::Value,
) -> Result<(), ApiError> {
    match command_type {
        "http" => check_http_task(state, payload),
        "exec" => check_exec_task(state, payload),
        _ => Ok(()),
    }
}

/// Refuse an `exec` task whose program is not a name on the allow-list, or whose
/// arguments are not a list of strings a program can receive (no NUL). Only where the
/// `exec` kind is configured: elsewhere `exec` may be an application's own command.
fn check_exec_task(state: &AppState, payload: &serde_json::Value) -> Result<(), ApiError> {
    let programs = &state.config().exec_programs;
    if programs.is_empty() {
        return Ok(());
    }
    // The payload is decoded strictly at run time: refuse now what would fail then.
    let Some(fields) = payload.as_object() else {
        return Err(
            ApiError::invalid("payload: must be an object holding program and args")
                .field("payload"),
        );
    };
    if let Some(other) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "program" | "args"))
    {
        let shown: String = other.chars().take(100).collect();
        return Err(ApiError::invalid(format!(
            "payload.{shown}: unknown field (an exec payload holds program and args)"
        ))
        .field(format!("payload.{shown}")));
    }
    let program = payload.get("program").and_then(|p| p.as_str());
    let Some(program) = program else {
        return Err(ApiError::invalid("payload.program: must be a string").field("payload.program"));
    };
    if !programs.contains(program) {
        let shown: String = program.chars().take(100).collect();
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_exec_program",
            format!(
                "payload.program {shown:?} is not on the exec allow-list (allowed: {})",
                programs.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
        .field("payload.program"));
    }
    match payload.get("args") {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::Array(args)) => {
            for (i, arg) in args.iter().enumerate() {
                let field = format!("payload.args[{i}]");
                match arg.as_str() {
                    Some(text) if !text.contains('\0') => {}
                    Some(_) => {
                        return Err(ApiError::invalid(format!(
                            "{field}: a program argument cannot hold a NUL character"
                        ))
                        .field(field))
                    }
                    None => {
                        return Err(
                            ApiError::invalid(format!("{field}: must be a string")).field(field)
                        )
                    }
                }
            }
            Ok(())
        }
        Some(_) => {
            Err(ApiError::invalid("payload.args: must be a list of strings").field("payload.args"))
        }
    }
}

/// Refuse an `http` task (or schedule) naming a target the deployment does not declare,
/// or whose path could leave its target. Only where the `http` kind has targets.
fn check_http_task(state: &AppState, payload: &serde_json::Value) -> Result<(), ApiError> {
    let targets = &state.config().http_targets;
    if targets.is_empty() {
        return Ok(());
    }
    let target = payload.get("target").and_then(|t| t.as_str());
    if !target.is_some_and(|t| targets.contains(t)) {
        let shown: String = target.unwrap_or("").chars().take(100).collect();
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_http_target",
            format!(
                "payload.target {shown:?} is not a configured http target (configured: {})",
                targets.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
        .field("payload.target"));
    }
    check_http_path(payload.get("path"))
}

/// Refuse an `http` task's `payload.path` that could leave its target's base path: the
/// check the `http` kind runs again before sending.
fn check_http_path(path: Option<&serde_json::Value>) -> Result<(), ApiError> {
    let refused = |message: String| {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "http_path_refused",
            format!("payload.path: {message}"),
        )
        .field("payload.path"))
    };
    match path {
        None | Some(serde_json::Value::Null) => Ok(()),
        Some(serde_json::Value::String(path)) => {
            match tenax_core::outbound::check_task_path(path) {
                Ok(()) => Ok(()),
                Err(refused_path) => refused(refused_path.to_string()),
            }
        }
        Some(_) => refused("must be a string".to_owned()),
    }
}

/// Turn a request into the library's enqueue of it, under the caller's name
/// (`created_by`), checking every field. The task is built by the library's own
/// builder (`Client::enqueue_raw`) and sent through it, so a task enqueued over HTTP
/// gets the defaults and the checks of one enqueued from Rust; this function only
/// checks the request's ranges (naming the field) and sets what the request gives.
/// The one default of the server's own is the attempt budget a `[retry]` section of
/// its configuration gives the command type. The task's number is fixed here, so
/// `Enqueue::params` shows what will be inserted to the checks made before the write.
pub(crate) fn enqueue_of(
    state: &AppState,
    req: EnqueueRequest,
    created_by: Option<String>,
) -> Result<Enqueue<'_>, ApiError> {
    check_command_type(state, &req.command_type)?;
    check_outbound(state, &req)?;
    let given = |field: &str, value: Option<i64>, min: i64, max: i64| {
        value
            .map(|v| in_range(field, Some(v), min, max, v))
            .transpose()
    };
    let priority = given("priority", req.priority, 0, 9)?;
    let max_attempts = given("max_attempts", req.max_attempts, 1, 1000)?;
    let timeout_ms = given("timeout_ms", req.timeout_ms, 1, 24 * 3600 * 1000)?;
    if req.delay_ms.is_some() && req.run_at.is_some() {
        return Err(ApiError::invalid("give delay_ms or run_at, not both").field("run_at"));
    }
    let max_delay_ms = i64::try_from(MAX_DELAY.as_millis()).unwrap_or(i64::MAX);
    let delay_ms = given("delay_ms", req.delay_ms, 0, max_delay_ms)?;
    let payload_version = given("payload_version", req.payload_version, 1, u32::MAX.into())?;
    let concurrency_limit = given("concurrency_limit", req.concurrency_limit, 1, 1000)?;

    let mut task = state
        .client()
        .enqueue_raw(&req.command_type, &req.payload)
        .max_attempts(state.config().max_attempts_of(&req.command_type));
    // Each value is in range (checked above), so the conversions cannot fail.
    let narrow = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    if let Some(no) = req.task_no {
        task = task.task_no(no);
    }
    if let Some(queue) = req.queue {
        task = task.queue(queue);
    }
    if let Some(p) = priority {
        task = task.priority(u8::try_from(p).unwrap_or(u8::MAX));
    }
    if let Some(n) = max_attempts {
        task = task.max_attempts(narrow(n));
    }
    if let Some(ms) = timeout_ms {
        task = task.timeout(Duration::from_millis(u64::from(narrow(ms))));
    }
    if let Some(ms) = delay_ms {
        task = task.run_in(Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    }
    if let Some(at) = req.run_at {
        task = task.run_at(at);
    }
    if let Some(v) = payload_version {
        task = task.payload_version(narrow(v));
    }
    if let Some(key) = req.concurrency_key {
        task = task.concurrency_key(key);
    }
    if let Some(n) = concurrency_limit {
        task = task.concurrency_limit(narrow(n));
    }
    if let Some(url) = req.callback_url {
        task = task.callback_url(url);
    }
    if let Some(name) = created_by {
        task = task.created_by(name);
    }
    let payload_len = task.params()?.payload.len();
    if payload_len > PAYLOAD_MAX_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("payload: {payload_len} bytes, at most {PAYLOAD_MAX_BYTES}"),
        )
        .field("payload"));
    }
    Ok(task)
}

/// 429 when the queue already holds its configured maximum of waiting tasks (a repeat
/// of an existing `task_no` still gets its task).
pub(crate) async fn check_pressure(
    state: &AppState,
    params: &TaskInsertParams,
) -> Result<(), ApiError> {
    let Some(max) = max_pending(state, &params.queue) else {
        return Ok(());
    };
    let pending = pending_count(state, &params.queue).await?;
    if pending < max {
        return Ok(());
    }
    if number_exists(state, &params.task_no).await? {
        return Ok(());
    }
    Err(queue_full(&params.queue, pending, max))
}

/// The configured maximum of waiting tasks of a queue, if it has one.
pub(crate) fn max_pending(state: &AppState, queue: &str) -> Option<u64> {
    state.config().queues.get(queue).and_then(|q| q.max_pending)
}

/// The waiting tasks of a queue: the cached count, read again when stale.
pub(crate) async fn pending_count(state: &AppState, queue: &str) -> Result<u64, ApiError> {
    if let Some(n) = state.inner.pending.get(queue) {
        return Ok(n);
    }
    let queues = state.db(state.storage().queue_list()).await?;
    let counts: Vec<(String, u64)> = queues.iter().map(|q| (q.name.clone(), q.waiting)).collect();
    let n = counts
        .iter()
        .find(|(name, _)| name == queue)
        .map_or(0, |(_, n)| *n);
    state.inner.pending.put(counts);
    state.inner.pending.put([(queue.to_owned(), n)]);
    Ok(n)
}

/// Whether a task holds this number.
pub(crate) async fn number_exists(state: &AppState, task_no: &TaskNo) -> Result<bool, ApiError> {
    let existing = state
        .db(state.storage().task_get(&TaskRef::No(task_no.clone())))
        .await?;
    Ok(existing.is_some())
}

pub(crate) fn queue_full(queue: &str, pending: u64, max: u64) -> ApiError {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "queue_full",
        format!("queue {queue:?} has {pending} waiting tasks, at most {max}: try again later"),
    )
    .retry_after(1)
}

/// The answer to an enqueue token repeating the number of a task enqueued under
/// another name: the same whether or not the type and payload match, so that the
/// answer tells nothing of that task but that its number is taken.
pub(crate) fn number_taken(task_no: &TaskNo) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "task_no_conflict",
        format!("task_no {:?} already exists", task_no.as_str()),
    )
    .field("task_no")
}

/// Enqueue one request under the caller's name: the task and whether it is new.
async fn enqueue_one(
    state: &AppState,
    caller: &Caller,
    req: EnqueueRequest,
) -> Result<(bool, TaskView), ApiError> {
    let mut task = enqueue_of(state, req, caller.enqueuer(state))?;
    let params = task.params()?;
    check_pressure(state, params).await?;
    let task_no = params.task_no.clone();
    let inserted = match state.db(task.into_future()).await {
        Ok(inserted) => inserted,
        Err(e) if e.code == "task_no_conflict" => {
            // Whether another's task has this type and payload is not the caller's to
            // learn.
            let existing = state
                .db(state.storage().task_get(&TaskRef::No(task_no.clone())))
                .await?;
            return Err(match existing {
                Some(t) if !caller.may_read(t.created_by.as_deref()) => number_taken(&task_no),
                _ => e,
            });
        }
        Err(e) => return Err(e),
    };
    if !inserted.created && !caller.may_read(inserted.task.created_by.as_deref()) {
        return Err(number_taken(&task_no));
    }
    if inserted.created {
        state.inner.pending.bump(&inserted.task.queue);
    }
    Ok((
        inserted.created,
        secrets::task(state.config(), TaskView::from_record(&inserted.task)),
    ))
}

/// Enqueue a task (idempotent by `task_no`).
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks", request_body = EnqueueRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created", body = TaskView),
        (status = 200, description = "The same task_no with the same type and payload: the existing task", body = TaskView),
        (status = 400, description = "Malformed JSON", body = ErrorBody),
        (status = 409, description = "The task_no exists with another type or payload", body = ErrorBody),
        (status = 413, description = "Body over the limit", body = ErrorBody),
        (status = 422, description = "Invalid field or unknown command type", body = ErrorBody),
        (status = 429, description = "The queue is full (Retry-After)", body = ErrorBody),
        (status = 503, description = "Database unavailable (Retry-After)", body = ErrorBody),
    ))]
pub(crate) async fn enqueue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<EnqueueRequest>,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let (created, task) = enqueue_one(&state, &caller, req).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(task)))
}

pub(crate) fn encode_cursor(before: i64) -> String {
    hex::encode(format!("v1:{before}"))
}

pub(crate) fn decode_cursor(cursor: &str) -> Result<TaskId, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad_cursor",
            "cursor: not a cursor this server issued (pass next_cursor back unchanged)",
        )
        .field("cursor")
    };
    let bytes = hex::decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let id: i64 = text
        .strip_prefix("v1:")
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(bad)?;
    Ok(TaskId(id))
}

/// Tasks newest first, filtered, a page at a time. A page holds at most `limit` tasks
/// and at most 4 MiB of them; a payload or result over 16 KiB is left out
/// (`payload_omitted`, `result_omitted`): `GET /v1/tasks/{id}` gives it whole.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks", params(ListQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page", body = TaskPage),
        (status = 400, description = "Bad cursor or query", body = ErrorBody),
        (status = 422, description = "Invalid filter", body = ErrorBody),
    ))]
pub(crate) async fn list(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<TaskPage>, ApiError> {
    let status = query
        .status
        .as_deref()
        .map(|s| {
            s.parse::<TaskStatus>().map_err(|_| {
                ApiError::invalid(format!(
                    "status: unknown status {:?}",
                    s.chars().take(40).collect::<String>()
                ))
                .field("status")
            })
        })
        .transpose()?;
    if let Some(t) = &query.command_type {
        tenax_core::validate_command_type(t).map_err(|e| ApiError::from(e).field("type"))?;
    }
    if let Some(q) = &query.queue {
        QueueName::new(q.clone())?;
    }
    let limit = query.limit.unwrap_or(PAGE_DEFAULT);
    if limit == 0 || limit > PAGE_MAX {
        return Err(
            ApiError::invalid(format!("limit: must be 1 to {PAGE_MAX}, got {limit}"))
                .field("limit"),
        );
    }
    if let (Some(after), Some(before)) = (query.created_after, query.created_before) {
        if after >= before {
            return Err(
                ApiError::invalid("created_after must be before created_before")
                    .field("created_after"),
            );
        }
    }
    let before_id = query.cursor.as_deref().map(decode_cursor).transpose()?;
    let params = list_params(&query, status, before_id, limit);
    let tasks = state.db(state.storage().task_list(&params)).await?;
    let (tasks, full) = bounded_page(
        tasks
            .iter()
            .map(|t| secrets::task(state.config(), TaskView::listed(t))),
        LIST_PAGE_MAX_BYTES,
    );
    // More may follow when the page is full, by rows or by bytes.
    let next_cursor = (full || tasks.len() == limit as usize)
        .then(|| tasks.last().map(|t| encode_cursor(t.id)))
        .flatten();
    Ok(Json(TaskPage { tasks, next_cursor }))
}

/// Counts the bytes written to it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The tasks of a page, in order, up to `max` bytes of their JSON (at least one), and
/// whether tasks were left for the next page by that bound.
pub(crate) fn bounded_page(
    tasks: impl Iterator<Item = TaskView>,
    max: usize,
) -> (Vec<TaskView>, bool) {
    let mut page = Vec::new();
    let mut bytes = 0usize;
    for task in tasks {
        let mut count = ByteCount(0);
        // Writing into a counter cannot fail; a failure would only count short.
        let _ = serde_json::to_writer(&mut count, &task);
        bytes = bytes.saturating_add(count.0 + 1);
        if bytes > max && !page.is_empty() {
            return (page, true);
        }
        page.push(task);
    }
    (page, false)
}

fn list_params(
    query: &ListQuery,
    status: Option<TaskStatus>,
    before_id: Option<TaskId>,
    limit: u32,
) -> TaskListParams {
    TaskListParams {
        status,
        command_type: query.command_type.clone(),
        queue: query.queue.clone(),
        before_id,
        limit,
        created_after: query.created_after,
        created_before: query.created_before,
        // Large values stay in the database: a page is bounded by bytes as well.
        value_max_bytes: Some(LIST_VALUE_MAX_BYTES),
        ..TaskListParams::default()
    }
}

/// A task the caller may read. Another's task is answered as a missing one, word for
/// word, so that an enqueue token cannot tell the ids of others' tasks from unused ids.
pub(super) async fn find(
    state: &AppState,
    caller: &Caller,
    task: TaskRef,
) -> Result<TaskView, ApiError> {
    let record = find_record(state, caller, task).await?;
    Ok(secrets::task(
        state.config(),
        TaskView::from_record(&record),
    ))
}

/// [`find`], the stored record.
async fn find_record(
    state: &AppState,
    caller: &Caller,
    task: TaskRef,
) -> Result<TaskRecord, ApiError> {
    let shown = task.to_string();
    match state.db(state.storage().task_get(&task)).await? {
        Some(t) if caller.may_read(t.created_by.as_deref()) => Ok(t),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "task_not_found",
            format!("task {shown} not found"),
        )),
    }
}

/// A task by id.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 404, description = "No such task, or another's task to an enqueue token (the same answer)", body = ErrorBody),
    ))]
pub(crate) async fn get_by_id(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<TaskView>, ApiError> {
    Ok(Json(find(&state, &caller, TaskRef::Id(TaskId(id))).await?))
}

/// A task by its business number.
#[utoipa::path(get, path = "/v1/tasks/by-no/{task_no}", tag = "tasks",
    params(("task_no" = String, Path, description = "Task number")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The task", body = TaskView),
        (status = 404, description = "No such task, or another's task to an enqueue token (the same answer)", body = ErrorBody),
    ))]
pub(crate) async fn get_by_no(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(task_no): ApiPath<String>,
) -> Result<Json<TaskView>, ApiError> {
    let no = TaskNo::new(task_no)?;
    Ok(Json(find(&state, &caller, TaskRef::No(no)).await?))
}

/// A task's attempts, oldest first (the last 20).
#[utoipa::path(get, path = "/v1/tasks/{id}/attempts", tag = "tasks",
    params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Attempts", body = Vec<AttemptView>),
        (status = 404, description = "No such task, or another's task to an enqueue token (the same answer)", body = ErrorBody),
    ))]
pub(crate) async fn attempts(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<Vec<AttemptView>>, ApiError> {
    let task = find_record(&state, &caller, TaskRef::Id(TaskId(id))).await?;
    let attempts = state.db(state.storage().task_attempts(TaskId(id))).await?;
    let masker = secrets::masker(state.config(), &task);
    Ok(Json(secrets::attempts(&masker, &attempts)))
}

/// Cancel a task (a running one is asked to stop and returned still running).
#[utoipa::path(post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Cancelled, or cancel requested", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Already finished", body = ErrorBody),
    ))]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<TaskView>, ApiError> {
    let params = TaskActionParams {
        task: TaskRef::Id(TaskId(id)),
        now: None,
    };
    let task = state.db(state.storage().task_cancel(&params)).await?;
    record(
        &state,
        &caller,
        "task.cancel",
        &id.to_string(),
        serde_json::json!({"status": task.status.as_str()}),
    )
    .await;
    Ok(Json(secrets::task(
        state.config(),
        TaskView::from_record(&task),
    )))
}

/// Retry a dead task with a fresh attempt budget.
#[utoipa::path(post, path = "/v1/tasks/{id}/retry", tag = "tasks",
    params(("id" = i64, Path, description = "Task id")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Pending again", body = TaskView),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "Not dead", body = ErrorBody),
    ))]
pub(crate) async fn retry(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<TaskView>, ApiError> {
    let params = TaskActionParams {
        task: TaskRef::Id(TaskId(id)),
        now: None,
    };
    let task = state.db(state.storage().task_retry(&params)).await?;
    record(
        &state,
        &caller,
        "task.retry",
        &id.to_string(),
        serde_json::json!({}),
    )
    .await;
    Ok(Json(secrets::task(
        state.config(),
        TaskView::from_record(&task),
    )))
}
