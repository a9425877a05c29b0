//! The web dashboard, served next to the API.
//!
//! `GET /` is a page shell that holds no data and needs no token, with one first-party
//! script and one stylesheet (`/assets/app.js`, `/assets/app.css`, compiled into the
//! binary). The script asks for a token, keeps it in the browser's `sessionStorage`,
//! and fetches HTML fragments (`/ui/...`) with `Authorization: Bearer`; it swaps them
//! in and refreshes them every few seconds. Fragments are rendered here: every value
//! is escaped by the templates, charts are SVG drawn by `plotters`, and action buttons
//! are rendered only for a role that may use them. The buttons post to the JSON API
//! (`/v1/...`), which checks the role again.
//!
//! Every response carries [`CSP`], which allows no inline script or style, and nothing
//! from another origin: the dashboard works without internet access.
use std::collections::BTreeMap;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde::Deserialize;
use tenax::storage::{
    AuditListParams, QueueStatsParams, TaskListFinishedParams, TaskListParams, TaskRef,
};
use tenax::{TaskId, TaskNo, TaskRecord, TaskStatus};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiPath, ApiQuery};
use crate::model::{ScheduleView, TaskView};
use crate::openapi::Access;
use crate::routes::secrets;
use crate::state::AppState;

mod charts;
mod graph;
mod pages;

/// The Content-Security-Policy of every response: scripts, styles and fetches from
/// this origin only, images from this origin or inline `data:`, no inline script or
/// style, no frames, no forms posting anywhere, no `<base>`.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Most tasks finished in the last hour that the overview reads (the latest ones).
const RECENT_MAX: u32 = 2000;
/// Tasks in one page of the task list, and in each section of the dead-task page.
const PAGE: u32 = 50;
/// Entries of the audit trail shown.
const AUDIT_PAGE: u32 = 100;

/// Add the security headers to every response.
pub(crate) async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the page shell (no data, no token needed).
pub(crate) async fn shell() -> Response {
    asset("text/html; charset=utf-8", pages::SHELL)
}

/// `GET /assets/app.js`.
pub(crate) async fn app_js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

/// `GET /assets/app.css`.
pub(crate) async fn app_css() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

/// A fragment: HTML that is never cached (it holds data a token was needed for).
fn fragment(markup: maud::Markup) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        markup.into_string(),
    )
        .into_response()
}

/// Who is looking, and whether operator actions are shown to them.
pub(crate) struct Viewer {
    pub(crate) name: String,
    pub(crate) role: &'static str,
    pub(crate) admin: bool,
}

impl Viewer {
    fn of(caller: &Caller) -> Self {
        Self {
            name: caller.name.clone(),
            role: caller.role.as_str(),
            admin: caller.role.may(Access::Admin),
        }
    }
}

/// Percentiles of one command type's run times in the last hour.
pub(crate) struct Latency {
    pub(crate) command_type: String,
    pub(crate) samples: usize,
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What the overview shows.
pub(crate) struct Overview {
    pub(crate) now: DateTime<Utc>,
    pub(crate) by_status: Vec<(TaskStatus, u64)>,
    pub(crate) total: u64,
    pub(crate) oldest_due_age_ms: Option<u64>,
    /// Per queue: name, due backlog, waiting (pending or retrying), paused.
    pub(crate) backlog: Vec<(String, u64)>,
    /// Per minute of the last hour, oldest first: succeeded, dead.
    pub(crate) per_minute: Vec<(u64, u64)>,
    pub(crate) latency: Vec<Latency>,
    /// Whether more tasks finished in the last hour than were read.
    pub(crate) truncated: bool,
}

async fn overview_data(state: &AppState) -> Result<Overview, ApiError> {
    let storage = state.storage();
    let stats = state.db(storage.stats()).await?;
    let queues = state
        .db(storage.queue_stats(&QueueStatsParams::default()))
        .await?;
    let now = state.db(storage.now()).await?;
    let since = now - ChronoDuration::hours(1);
    let mut per_minute = vec![(0u64, 0u64); 60];
    let mut runs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let params = TaskListFinishedParams {
        since,
        limit: RECENT_MAX,
    };
    let finished = state.db(storage.task_list_finished(&params)).await?;
    let truncated = finished.len() == RECENT_MAX as usize;
    for task in &finished {
        let Some(at) = task.finished_at.filter(|at| *at <= now) else {
            continue;
        };
        let minute = (at - since).num_seconds() / 60;
        let slot = usize::try_from(minute).unwrap_or(0).min(59);
        if task.status == TaskStatus::Succeeded {
            per_minute[slot].0 += 1;
            if let Some(started) = task.started_at {
                let ms = (at - started).num_milliseconds().max(0) as f64;
                runs.entry(task.command_type.clone()).or_default().push(ms);
            }
        } else {
            per_minute[slot].1 += 1;
        }
    }
    let latency = runs
        .into_iter()
        .map(|(command_type, mut samples)| {
            samples.sort_by(f64::total_cmp);
            Latency {
                command_type,
                samples: samples.len(),
                p50: percentile(&samples, 50.0),
                p95: percentile(&samples, 95.0),
                p99: percentile(&samples, 99.0),
            }
        })
        .collect();
    let by_status = TaskStatus::ALL
        .iter()
        .map(|s| (*s, stats.count(*s)))
        .collect();
    Ok(Overview {
        now,
        total: stats.total(),
        by_status,
        oldest_due_age_ms: stats
            .oldest_due_age
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        backlog: queues
            .iter()
            .map(|q| (q.queue.clone(), q.backlog))
            .collect(),
        per_minute,
        latency,
        truncated,
    })
}

/// `GET /ui/overview`.
pub(crate) async fn overview(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let data = overview_data(&state).await?;
    Ok(fragment(pages::overview(&Viewer::of(&caller), &data)))
}

/// `GET /ui/queues`: the queues with their limits, the rate limits per command type, and
/// the event rules.
pub(crate) async fn queues(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let storage = state.storage();
    let queues = state.db(storage.queue_list()).await?;
    let rate_limits = state.db(storage.rate_limit_list()).await?;
    let event_rules = state.db(storage.event_rule_list()).await?;
    Ok(fragment(pages::queues(
        &Viewer::of(&caller),
        &queues,
        &rate_limits,
        &event_rules,
    )))
}

/// Filters of the task list (an empty field is no filter).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TaskQuery {
    pub(crate) status: Option<String>,
    #[serde(rename = "type")]
    pub(crate) command_type: Option<String>,
    pub(crate) queue: Option<String>,
    pub(crate) task_no: Option<String>,
    pub(crate) before: Option<i64>,
}

fn given(field: &Option<String>) -> Option<String> {
    field
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn views(state: &AppState, tasks: &[TaskRecord]) -> Vec<TaskView> {
    tasks
        .iter()
        .map(|t| secrets::task(state.config(), TaskView::from_record(t)))
        .collect()
}

/// `GET /ui/tasks`: filters, search by `task_no`, newest first.
pub(crate) async fn tasks(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiQuery(query): ApiQuery<TaskQuery>,
) -> Result<Response, ApiError> {
    let viewer = Viewer::of(&caller);
    if let Some(no) = given(&query.task_no) {
        // A compensation task's number holds the reserved infix; it is found as stored.
        let no = if no.contains(TaskNo::COMPENSATION_INFIX) && no.len() <= 512 {
            TaskNo::from_stored(no)
        } else {
            TaskNo::new(no)?
        };
        let found = state.db(state.storage().task_get(&TaskRef::No(no))).await?;
        let tasks = views(&state, found.as_slice());
        return Ok(fragment(pages::tasks(&viewer, &query, &tasks, None)));
    }
    let status = given(&query.status)
        .map(|s| {
            s.parse::<TaskStatus>()
                .map_err(|_| ApiError::invalid("status: unknown status").field("status"))
        })
        .transpose()?;
    let params = TaskListParams {
        status,
        command_type: given(&query.command_type),
        queue: given(&query.queue),
        before_id: query.before.map(TaskId),
        limit: PAGE,
        // The list shows neither payloads nor results: they stay in the database.
        value_max_bytes: Some(0),
        ..TaskListParams::default()
    };
    let found = state.db(state.storage().task_list(&params)).await?;
    let older = (found.len() == PAGE as usize)
        .then(|| found.last().map(|t| t.id.0))
        .flatten();
    let tasks = views(&state, &found);
    Ok(fragment(pages::tasks(&viewer, &query, &tasks, older)))
}

/// `GET /ui/tasks/{id}`: one task with its attempts, result, compensation,
/// compensation task and workflow.
pub(crate) async fn task(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Response, ApiError> {
    let storage = state.storage();
    let Some(record) = state.db(storage.task_get(&TaskRef::Id(TaskId(id)))).await? else {
        return Err(ApiError::not_found(format!("task {id} not found")));
    };
    let attempts = state.db(storage.task_attempts(TaskId(id))).await?;
    let attempts = secrets::attempts(&secrets::masker(state.config(), &record), &attempts);
    // A dead task's compensation runs as a task of its own, numbered after the task,
    // its id and the epoch it died under.
    let compensation = if record.compensation.is_some() {
        let no = format!(
            "{}{}{}:{}",
            record.task_no.as_str(),
            TaskNo::COMPENSATION_INFIX,
            record.id.0,
            record.lease_epoch
        );
        // The infix is reserved for these numbers, so `TaskNo::new` refuses them.
        state
            .db(storage.task_get(&TaskRef::No(TaskNo::from_stored(no))))
            .await?
            .filter(|c| c.parent_id == Some(record.id))
            .map(|c| secrets::task(state.config(), TaskView::from_record(&c)))
    } else {
        None
    };
    let workflow = state.db(storage.task_workflow(record.id)).await?;
    let view = secrets::task(state.config(), TaskView::from_record(&record));
    Ok(fragment(pages::task(
        &Viewer::of(&caller),
        &view,
        &attempts,
        compensation.as_ref(),
        workflow,
    )))
}

/// `GET /ui/dead`: dead tasks with their errors, and the tasks failing now.
pub(crate) async fn dead(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let list = |status| TaskListParams {
        status: Some(status),
        limit: PAGE,
        // The lists show neither payloads nor results: they stay in the database.
        value_max_bytes: Some(0),
        ..TaskListParams::default()
    };
    let dead = state
        .db(state.storage().task_list(&list(TaskStatus::Dead)))
        .await?;
    let retrying = state
        .db(state.storage().task_list(&list(TaskStatus::Retrying)))
        .await?;
    Ok(fragment(pages::dead(
        &Viewer::of(&caller),
        &views(&state, &dead),
        &views(&state, &retrying),
    )))
}

/// `GET /ui/schedules`.
pub(crate) async fn schedules(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let schedules = state.db(state.storage().schedule_list()).await?;
    let schedules: Vec<ScheduleView> = schedules
        .iter()
        .map(|s| secrets::schedule(state.config(), ScheduleView::from_record(s)))
        .collect();
    Ok(fragment(pages::schedules(&Viewer::of(&caller), &schedules)))
}

/// `GET /ui/audit`.
pub(crate) async fn audit(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let params = AuditListParams {
        limit: AUDIT_PAGE,
        ..AuditListParams::default()
    };
    let entries = state.db(state.storage().audit_list(&params)).await?;
    Ok(fragment(pages::audit(&Viewer::of(&caller), &entries)))
}

/// `GET /ui/workflows/{id}`: a workflow with its tasks and their parents.
pub(crate) async fn workflow(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<i64>,
) -> Result<Response, ApiError> {
    let Some(detail) = state.db(state.storage().workflow_get(id)).await? else {
        return Err(ApiError::not_found(format!("workflow {id} not found")));
    };
    let tasks: Vec<(String, Vec<String>, TaskView)> = detail
        .tasks
        .iter()
        .map(|t| {
            (
                t.key.clone(),
                t.parents.clone(),
                secrets::task(state.config(), TaskView::listed(&t.task)),
            )
        })
        .collect();
    Ok(fragment(pages::workflow(
        &Viewer::of(&caller),
        &detail.workflow,
        &tasks,
    )))
}

/// `GET /ui/workflows`: the latest workflows.
pub(crate) async fn workflows(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    let params = tenax::storage::WorkflowListParams {
        before_id: None,
        limit: PAGE,
    };
    let list = state.db(state.storage().workflow_list(&params)).await?;
    Ok(fragment(pages::workflows(&Viewer::of(&caller), &list)))
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
