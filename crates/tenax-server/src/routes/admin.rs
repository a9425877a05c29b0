//! Operations: stats, schedules, queues and their limits, rate limits, and the audit
//! record of operator actions.
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use tenax::storage::{
    AuditAppendParams, QueueChange, QueueStatsParams, QueueUpdateParams, RateLimitSetParams,
    SchedulePauseParams, ScheduleUpsertParams, ScheduleUpserted,
};
use tenax::{MissedTicks, QueueName, Schedule};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::model::*;
use crate::routes::secrets;
use crate::routes::tasks::{check_command_type, check_kind_payload};
use crate::state::AppState;

/// Record an operator action in the audit trail (who, what, on what). A failure to
/// record is logged; the action itself has already been committed.
pub(crate) async fn record(
    state: &AppState,
    caller: &Caller,
    action: &str,
    target: &str,
    details: serde_json::Value,
) {
    tracing::info!(actor = %caller.name, action, target, "operator action");
    let params = AuditAppendParams {
        actor: caller.name.clone(),
        action: action.to_owned(),
        target: target.to_owned(),
        details,
        now: None,
    };
    if let Err(e) = state.db(state.storage().audit_append(&params)).await {
        tracing::error!(actor = %caller.name, action, target, error = %e, "the operator action was done but not recorded in the audit log");
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Counts by status, command type and queue; backlog and oldest due age.
#[utoipa::path(get, path = "/v1/stats", tag = "operations",
    security(("bearer" = [])),
    responses((status = 200, description = "Counts", body = StatsView)))]
pub(crate) async fn stats(State(state): State<AppState>) -> Result<Json<StatsView>, ApiError> {
    let stats = state.db(state.storage().stats()).await?;
    let queues = state
        .db(state.storage().queue_stats(&QueueStatsParams::default()))
        .await?;
    Ok(Json(StatsView {
        total: stats.total(),
        by_status: stats
            .by_status
            .iter()
            .map(|(s, n)| StatusCount {
                status: s.to_string(),
                count: *n,
            })
            .collect(),
        by_type: stats
            .by_type
            .iter()
            .map(|(t, s, n)| TypeCount {
                command_type: t.clone(),
                status: s.to_string(),
                count: *n,
            })
            .collect(),
        queues: queues
            .iter()
            .map(|q| QueueCounts {
                queue: q.queue.clone(),
                by_status: q
                    .by_status
                    .iter()
                    .map(|(s, n)| StatusCount {
                        status: s.to_string(),
                        count: *n,
                    })
                    .collect(),
                backlog: q.backlog,
                oldest_due_age_ms: q.oldest_due_age.map(ms),
            })
            .collect(),
        oldest_due_age_ms: stats.oldest_due_age.map(ms),
    }))
}

/// Every schedule, by name.
#[utoipa::path(get, path = "/v1/schedules", tag = "operations",
    security(("bearer" = [])),
    responses((status = 200, description = "Schedules", body = Vec<ScheduleView>)))]
pub(crate) async fn list_schedules(
    State(state): State<AppState>,
) -> Result<Json<Vec<ScheduleView>>, ApiError> {
    let schedules = state.db(state.storage().schedule_list()).await?;
    Ok(Json(
        schedules
            .iter()
            .map(|s| secrets::schedule(state.config(), ScheduleView::from_record(s)))
            .collect(),
    ))
}

fn small(
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

/// A schedule the core refused, its field named as the request names it.
fn schedule_refused(e: tenax::InvalidInput) -> ApiError {
    let field = match e.field {
        "schedule name" => Some("name"),
        "every" => Some("every_secs"),
        "timeout" => Some("timeout_ms"),
        "context" => Some("payload"),
        "cron" | "timezone" | "catch_up" | "payload" | "payload_version" | "max_attempts"
        | "queue" | "priority" | "command_type" => Some(e.field),
        _ => None,
    };
    let error = ApiError::invalid(e.to_string());
    match field {
        Some(field) => error.field(field),
        None => error,
    }
}

/// Create a schedule, or update the one of the same name.
#[utoipa::path(post, path = "/v1/schedules", tag = "operations", request_body = ScheduleRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created", body = ScheduleView),
        (status = 200, description = "Updated or unchanged", body = ScheduleView),
        (status = 422, description = "Invalid cron, zone or field", body = ErrorBody),
    ))]
pub(crate) async fn create_schedule(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<ScheduleRequest>,
) -> Result<(StatusCode, Json<ScheduleView>), ApiError> {
    check_command_type(&state, &req.command_type)?;
    check_kind_payload(&state, &req.command_type, &req.payload)?;
    let mut schedule = match (&req.cron, req.every_secs) {
        (Some(cron), None) => Schedule::cron(&req.name, cron),
        (None, Some(secs)) if secs > 0 && secs <= 366 * 24 * 3600 => {
            Schedule::every(&req.name, Duration::from_secs(secs))
        }
        (None, Some(secs)) => {
            return Err(
                ApiError::invalid(format!("every_secs: must be 1 to 31622400, got {secs}"))
                    .field("every_secs"),
            )
        }
        _ => return Err(ApiError::invalid("give cron or every_secs (one of them)").field("cron")),
    };
    if let Some(zone) = &req.timezone {
        schedule = schedule.timezone(zone);
    }
    if let Some(n) = req.catch_up {
        schedule = schedule.missed(MissedTicks::CatchUp(n));
    }
    let queue = QueueName::new(
        req.queue
            .clone()
            .unwrap_or_else(|| QueueName::DEFAULT.to_owned()),
    )?;
    let d = tenax_core::CommandDefaults::STANDARD;
    let priority = small("priority", req.priority, 0, 9, i64::from(d.priority))?;
    let default_attempts = state.config().max_attempts_of(&req.command_type);
    let max_attempts = small(
        "max_attempts",
        req.max_attempts,
        1,
        1000,
        i64::from(default_attempts),
    )?;
    let timeout_ms = small(
        "timeout_ms",
        req.timeout_ms,
        1,
        24 * 3600 * 1000,
        i64::try_from(d.timeout.as_millis()).unwrap_or(i64::MAX),
    )?;
    let def = schedule
        .command_raw(&req.command_type, &req.payload)
        .queue(queue.to_string())
        .priority(u8::try_from(priority).unwrap_or(d.priority))
        .max_attempts(u32::try_from(max_attempts).unwrap_or(default_attempts))
        .timeout(u64::try_from(timeout_ms).map_or(d.timeout, Duration::from_millis))
        .build()
        .map_err(schedule_refused)?;
    let (stored, change) = state
        .db(state
            .storage()
            .schedule_upsert(&ScheduleUpsertParams { def, now: None }))
        .await?;
    let action = match change {
        ScheduleUpserted::Created => "schedule.create",
        ScheduleUpserted::Updated => "schedule.update",
        ScheduleUpserted::Unchanged => "schedule.upsert_unchanged",
    };
    if change != ScheduleUpserted::Unchanged {
        record(&state, &caller, action, &stored.def.name, serde_json::json!({"cadence": stored.def.cadence.to_string(), "command_type": stored.def.command_type})).await;
    }
    let status = if change == ScheduleUpserted::Created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(secrets::schedule(
            state.config(),
            ScheduleView::from_record(&stored),
        )),
    ))
}

async fn set_paused(
    state: &AppState,
    caller: &Caller,
    name: String,
    paused: bool,
) -> Result<Json<ScheduleView>, ApiError> {
    let params = SchedulePauseParams {
        name: name.clone(),
        paused,
        now: None,
    };
    let stored = state
        .db(state.storage().schedule_set_paused(&params))
        .await?;
    let action = if paused {
        "schedule.pause"
    } else {
        "schedule.resume"
    };
    record(state, caller, action, &name, serde_json::json!({})).await;
    Ok(Json(secrets::schedule(
        state.config(),
        ScheduleView::from_record(&stored),
    )))
}

/// Pause a schedule.
#[utoipa::path(post, path = "/v1/schedules/{name}/pause", tag = "operations",
    params(("name" = String, Path, description = "Schedule name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Paused", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ))]
pub(crate) async fn pause_schedule(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&state, &caller, name, true).await
}

/// Resume a schedule from its first tick after now.
#[utoipa::path(post, path = "/v1/schedules/{name}/resume", tag = "operations",
    params(("name" = String, Path, description = "Schedule name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Resumed", body = ScheduleView),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ))]
pub(crate) async fn resume_schedule(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    set_paused(&state, &caller, name, false).await
}

/// Delete a schedule (the tasks it enqueued stay).
#[utoipa::path(delete, path = "/v1/schedules/{name}", tag = "operations",
    params(("name" = String, Path, description = "Schedule name")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such schedule", body = ErrorBody),
    ))]
pub(crate) async fn delete_schedule(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.db(state.storage().schedule_remove(&name)).await?;
    record(
        &state,
        &caller,
        "schedule.remove",
        &name,
        serde_json::json!({}),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

/// Every queue with tasks or controls.
#[utoipa::path(get, path = "/v1/queues", tag = "operations",
    security(("bearer" = [])),
    responses((status = 200, description = "Queues", body = Vec<QueueView>)))]
pub(crate) async fn list_queues(
    State(state): State<AppState>,
) -> Result<Json<Vec<QueueView>>, ApiError> {
    let queues = state.db(state.storage().queue_list()).await?;
    state
        .inner
        .pending
        .put(queues.iter().map(|q| (q.name.clone(), q.waiting)));
    Ok(Json(
        queues
            .iter()
            .map(|q| QueueView::new(q, max_pending(&state, &q.name)))
            .collect(),
    ))
}

fn max_pending(state: &AppState, queue: &str) -> Option<u64> {
    state.config().queues.get(queue).and_then(|q| q.max_pending)
}

/// The queue a path parameter `name` names, or 422 naming it.
fn queue_of(name: String) -> Result<QueueName, ApiError> {
    QueueName::new(name).map_err(|e| ApiError::from(e).field("name"))
}

async fn update_queue(
    state: &AppState,
    caller: &Caller,
    queue: QueueName,
    change: QueueChange,
    action: &str,
    details: serde_json::Value,
) -> Result<Json<QueueView>, ApiError> {
    let params = QueueUpdateParams {
        queue: queue.to_string(),
        change,
        now: None,
    };
    let info = state.db(state.storage().queue_update(&params)).await?;
    record(state, caller, action, queue.as_str(), details).await;
    Ok(Json(QueueView::new(&info, max_pending(state, &info.name))))
}

/// Pause a queue: nothing more is claimed from it; running tasks finish.
#[utoipa::path(post, path = "/v1/queues/{name}/pause", tag = "operations",
    params(("name" = String, Path, description = "Queue name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Paused", body = QueueView),
        (status = 422, description = "Invalid queue name", body = ErrorBody),
    ))]
pub(crate) async fn pause_queue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<QueueView>, ApiError> {
    let queue = queue_of(name)?;
    update_queue(
        &state,
        &caller,
        queue,
        QueueChange::Pause,
        "queue.pause",
        serde_json::json!({}),
    )
    .await
}

/// Resume a queue.
#[utoipa::path(post, path = "/v1/queues/{name}/resume", tag = "operations",
    params(("name" = String, Path, description = "Queue name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Resumed", body = QueueView),
        (status = 422, description = "Invalid queue name", body = ErrorBody),
    ))]
pub(crate) async fn resume_queue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<QueueView>, ApiError> {
    let queue = queue_of(name)?;
    update_queue(
        &state,
        &caller,
        queue,
        QueueChange::Resume,
        "queue.resume",
        serde_json::json!({}),
    )
    .await
}

/// The most a queue's limit may be (the stores keep it as a 32-bit signed integer).
const MAX_RUNNING_MAX: i64 = i32::MAX as i64;

/// Limit how many of a queue's tasks run at once across all nodes (set or change).
#[utoipa::path(put, path = "/v1/queues/{name}/limit", tag = "operations",
    params(("name" = String, Path, description = "Queue name (need not have tasks yet)")),
    request_body = QueueLimitRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Limited", body = QueueView),
        (status = 422, description = "Invalid queue name or limit", body = ErrorBody),
    ))]
pub(crate) async fn limit_queue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<QueueLimitRequest>,
) -> Result<Json<QueueView>, ApiError> {
    let queue = queue_of(name)?;
    let refused = || {
        ApiError::invalid(format!(
            "max_running: must be 1 to {MAX_RUNNING_MAX}, got {} (to stop the queue, pause \
             it; to remove its limit, DELETE it)",
            req.max_running
        ))
        .field("max_running")
    };
    if !(1..=MAX_RUNNING_MAX).contains(&req.max_running) {
        return Err(refused());
    }
    let max_running = u32::try_from(req.max_running).map_err(|_| refused())?;
    update_queue(
        &state,
        &caller,
        queue,
        QueueChange::MaxRunning(Some(max_running)),
        "queue.limit",
        serde_json::json!({ "max_running": max_running }),
    )
    .await
}

/// Remove a queue's limit on running tasks (a queue without one answers the same).
#[utoipa::path(delete, path = "/v1/queues/{name}/limit", tag = "operations",
    params(("name" = String, Path, description = "Queue name")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Unlimited", body = QueueView),
        (status = 422, description = "Invalid queue name", body = ErrorBody),
    ))]
pub(crate) async fn unlimit_queue(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<QueueView>, ApiError> {
    let queue = queue_of(name)?;
    update_queue(
        &state,
        &caller,
        queue,
        QueueChange::MaxRunning(None),
        "queue.unlimit",
        serde_json::json!({}),
    )
    .await
}

/// The highest rate, in tasks per second, and the largest burst (the stores' bounds).
const PER_SECOND_MAX: f64 = tenax::storage::RateLimit::PER_SECOND_MAX;
const BURST_MAX: u32 = tenax::storage::RateLimit::BURST_MAX;

/// The command type a path parameter `command_type` names, or 422 naming it. Any valid
/// name: workers of other processes may run types this server does not accept.
fn command_type_of(command_type: &str) -> Result<(), ApiError> {
    tenax_core::validate_command_type(command_type)
        .map_err(|e| ApiError::invalid(e.to_string()).field("command_type"))
}

/// Every rate limit, by command type.
#[utoipa::path(get, path = "/v1/rate-limits", tag = "operations",
    security(("bearer" = [])),
    responses((status = 200, description = "Rate limits", body = Vec<RateLimitView>)))]
pub(crate) async fn list_rate_limits(
    State(state): State<AppState>,
) -> Result<Json<Vec<RateLimitView>>, ApiError> {
    let limits = state.db(state.storage().rate_limit_list()).await?;
    Ok(Json(limits.iter().map(RateLimitView::from).collect()))
}

/// Limit how fast tasks of a command type start across all nodes, or change its limit:
/// a token bucket of `burst` tasks refilled at `per_second`. A task without a token
/// waits without spending an attempt, and other types are claimed meanwhile.
#[utoipa::path(put, path = "/v1/rate-limits/{command_type}", tag = "operations",
    params(("command_type" = String, Path, description = "Command type (need not have tasks yet)")),
    request_body = RateLimitRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Set", body = RateLimitView),
        (status = 422, description = "Invalid command type, rate or burst", body = ErrorBody),
    ))]
pub(crate) async fn set_rate_limit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(command_type): ApiPath<String>,
    ApiJson(req): ApiJson<RateLimitRequest>,
) -> Result<Json<RateLimitView>, ApiError> {
    command_type_of(&command_type)?;
    let per_second = req.per_second;
    if !(per_second.is_finite() && per_second > 0.0 && per_second <= PER_SECOND_MAX) {
        return Err(ApiError::invalid(format!(
            "per_second: must be above 0 and at most 1000000, got {per_second}"
        ))
        .field("per_second"));
    }
    let burst = small(
        "burst",
        req.burst,
        1,
        i64::from(BURST_MAX),
        i64::from(tenax::storage::RateLimit::default_burst(per_second)),
    )?;
    let burst = u32::try_from(burst)
        .map_err(|_| ApiError::invalid(format!("burst: {burst} is too large")).field("burst"))?;
    let params = RateLimitSetParams {
        command_type: command_type.clone(),
        per_second,
        burst,
        now: None,
    };
    let stored = state.db(state.storage().rate_limit_set(&params)).await?;
    record(
        &state,
        &caller,
        "rate_limit.set",
        &command_type,
        serde_json::json!({ "per_second": stored.per_second, "burst": stored.burst }),
    )
    .await;
    Ok(Json(RateLimitView::from(&stored)))
}

/// Remove a command type's rate limit.
#[utoipa::path(delete, path = "/v1/rate-limits/{command_type}", tag = "operations",
    params(("command_type" = String, Path, description = "Command type")),
    security(("bearer" = [])),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "The command type has no rate limit", body = ErrorBody),
        (status = 422, description = "Invalid command type", body = ErrorBody),
    ))]
pub(crate) async fn remove_rate_limit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(command_type): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    command_type_of(&command_type)?;
    state
        .db(state.storage().rate_limit_remove(&command_type))
        .await?;
    record(
        &state,
        &caller,
        "rate_limit.remove",
        &command_type,
        serde_json::json!({}),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}
