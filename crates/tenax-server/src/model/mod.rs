//! The JSON shapes of requests and answers, with their OpenAPI schemas and examples.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tenax::storage::{EventRule, QueueInfo, RateLimit, ScheduleRecord};
use tenax::{AttemptRecord, TaskRecord};
use utoipa::{IntoParams, ToSchema};

mod batch;
mod workflows;

pub use batch::*;
pub use workflows::*;

/// The error body every failure carries.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"error": {"code": "invalid_input", "field": "priority", "message": "priority: must be 0 to 9, got 12"}}))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// A machine-readable code, the request field at fault when known, and a message for
/// people.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code.
    pub code: String,
    /// The request field at fault, when known: a dotted path into the JSON body
    /// (`task_no`, `tasks[3].payload`), or the name of a query or path parameter
    /// (`status`, `limit`, `cursor`, `id`). Absent when the error is about the request
    /// as a whole (a body that is not JSON at all, a missing token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What went wrong.
    pub message: String,
}

/// A task as the API shows it (secret payload fields replaced by `"***"`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "id": 42, "task_no": "order-7-confirm", "kind": "execute", "parent_id": null,
    "command_type": "echo", "payload": {"hello": "world"}, "payload_version": 1,
    "queue": "default", "priority": 5, "status": "succeeded", "attempt": 1, "max_attempts": 5,
    "run_at": "2026-01-01T10:00:00Z", "timeout_ms": 1800000, "last_error": null,
    "result": {"hello": "world"}, "compensation": null, "concurrency_key": null,
    "created_at": "2026-01-01T10:00:00Z", "updated_at": "2026-01-01T10:00:01Z",
    "started_at": "2026-01-01T10:00:00Z", "finished_at": "2026-01-01T10:00:01Z"
}))]
pub struct TaskView {
    /// Database id.
    pub id: i64,
    /// Business number (idempotency key).
    pub task_no: String,
    /// `execute` or `compensate`.
    pub kind: String,
    /// For a compensation task, the task it compensates.
    pub parent_id: Option<i64>,
    /// Command type.
    pub command_type: String,
    /// The context the handler receives. In a list, `null` when longer than 16 KiB
    /// (`payload_omitted`): read the task alone (`GET /v1/tasks/{id}`) for all of it.
    pub payload: Value,
    /// `true` when this answer leaves the payload out (a list's bound on each value);
    /// absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub payload_omitted: bool,
    /// The payload's shape version.
    pub payload_version: u32,
    /// Queue.
    pub queue: String,
    /// 0 (least urgent) to 9.
    pub priority: u8,
    /// `pending`, `running`, `retrying`, `blocked`, `succeeded`, `dead` or `cancelled`.
    pub status: String,
    /// Attempts started.
    pub attempt: u32,
    /// Attempt budget.
    pub max_attempts: u32,
    /// When it may run next (UTC).
    pub run_at: DateTime<Utc>,
    /// Per-attempt timeout.
    pub timeout_ms: u64,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// The handler's result, once succeeded. In a list, `null` when longer than 16 KiB
    /// (`result_omitted`).
    pub result: Option<Value>,
    /// `true` when this answer leaves the result out (a list's bound on each value);
    /// absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub result_omitted: bool,
    /// Compensation state of a dead task.
    pub compensation: Option<String>,
    /// Business key limiting how many such tasks run at once.
    pub concurrency_key: Option<String>,
    /// Created (UTC).
    pub created_at: DateTime<Utc>,
    /// Last changed (UTC).
    pub updated_at: DateTime<Utc>,
    /// First claimed (UTC).
    pub started_at: Option<DateTime<Utc>>,
    /// Reached a final status (UTC).
    pub finished_at: Option<DateTime<Utc>>,
    /// The name of the API token that enqueued it; `null` for a task enqueued
    /// otherwise (the library, the CLI, a schedule) or by a server without tokens. An
    /// `enqueue` token reads only the tasks enqueued under its own name.
    #[serde(default)]
    pub created_by: Option<String>,
}

fn parse_json_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Longest payload or result a list answer carries, in bytes: a longer one is left
/// out (`payload_omitted`, `result_omitted`), for `GET /v1/tasks/{id}` to give whole.
pub const LIST_VALUE_MAX_BYTES: u32 = 16 * 1024;

/// Most bytes of tasks one list answer carries: a page stops before the task that would
/// pass it (it always holds one), and its `next_cursor` continues from there.
pub const LIST_PAGE_MAX_BYTES: usize = 4 * 1024 * 1024;

impl TaskView {
    /// The view of a task in a list: as [`TaskView::from_record`], with a payload or
    /// result longer than [`LIST_VALUE_MAX_BYTES`] left out.
    pub fn listed(task: &TaskRecord) -> Self {
        let max = LIST_VALUE_MAX_BYTES as usize;
        let mut view = Self::from_record(task);
        if task.payload.len() > max {
            view.payload = Value::Null;
            view.payload_omitted = true;
        }
        if task.result.as_ref().is_some_and(|r| r.len() > max) {
            view.result = None;
            view.result_omitted = true;
        }
        view
    }

    /// The view of a stored task, secrets not yet removed. A value a list left out
    /// (the empty string, see [`TaskListParams::value_max_bytes`]) is `null`, marked
    /// omitted.
    ///
    /// [`TaskListParams::value_max_bytes`]: tenax::storage::TaskListParams::value_max_bytes
    pub fn from_record(task: &TaskRecord) -> Self {
        let payload_omitted = task.payload.is_empty();
        let result_omitted = task.result.as_deref() == Some("");
        Self {
            id: task.id.0,
            task_no: task.task_no.as_str().to_owned(),
            kind: task.kind.as_str().to_owned(),
            parent_id: task.parent_id.map(|p| p.0),
            command_type: task.command_type.clone(),
            payload: if payload_omitted {
                Value::Null
            } else {
                parse_json_text(&task.payload)
            },
            payload_omitted,
            payload_version: task.payload_version,
            queue: task.queue.clone(),
            priority: task.priority.get(),
            status: task.status.to_string(),
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            run_at: task.run_at,
            timeout_ms: task.timeout_ms,
            last_error: task.last_error.clone(),
            result: task
                .result
                .as_deref()
                .filter(|_| !result_omitted)
                .map(parse_json_text),
            result_omitted,
            compensation: task.compensation.map(|c| c.as_str().to_owned()),
            concurrency_key: task.concurrency_key.clone(),
            created_at: task.created_at,
            updated_at: task.updated_at,
            started_at: task.started_at,
            finished_at: task.finished_at,
            created_by: task.created_by.clone(),
        }
    }
}

/// A task to enqueue. Only `command_type` is required.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"command_type": "echo", "payload": {"hello": "world"}, "task_no": "order-7-confirm", "priority": 7, "delay_ms": 0}))]
pub struct EnqueueRequest {
    /// A command type the server accepts.
    pub command_type: String,
    /// The handler's context (any JSON; default `{}`). An object with the same key
    /// twice is refused.
    #[serde(default = "empty_object", deserialize_with = "unique_keys")]
    pub payload: Value,
    /// Idempotency key: enqueueing the same number again returns the same task (200),
    /// or 409 if its type or payload differ. Default: a fresh UUIDv7.
    pub task_no: Option<String>,
    /// Queue. Default `default`.
    pub queue: Option<String>,
    /// 0 to 9 (9 most urgent). Default 5.
    pub priority: Option<i64>,
    /// Attempt budget, 1 to 1000. Default 5.
    pub max_attempts: Option<i64>,
    /// Per-attempt timeout in milliseconds, 1 ms to 24 h. Default 30 minutes.
    pub timeout_ms: Option<i64>,
    /// Run no sooner than this many milliseconds from now (at most 100 years).
    pub delay_ms: Option<i64>,
    /// Run no sooner than this instant (instead of `delay_ms`).
    pub run_at: Option<DateTime<Utc>>,
    /// Payload shape version, at least 1. Default 1.
    pub payload_version: Option<i64>,
    /// Business key: at most `concurrency_limit` tasks with this key run at once.
    pub concurrency_key: Option<String>,
    /// The key's limit, 1 to 1000. Default 1.
    pub concurrency_limit: Option<i64>,
    /// Where to POST the task's final outcome (succeeded, dead or cancelled), signed.
    /// Its host must be in the server's `[callbacks] allow_hosts` (422 otherwise).
    #[serde(default)]
    pub callback_url: Option<String>,
}

fn empty_object() -> Value {
    json!({})
}

/// Any JSON value, refusing an object that has the same key twice: JSON leaves such an
/// object's meaning open (parsers keep the first, the last, or fail), so a payload that
/// a handler in another language could read differently is not accepted.
fn unique_keys<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    deserializer.deserialize_any(UniqueKeys)
}

struct UniqueKeys;

impl<'de> serde::de::DeserializeSeed<'de> for UniqueKeys {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(UniqueKeys)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                let shown: String = key.chars().take(40).collect();
                // serde's wording for a struct's repeated field, which the API's
                // decoder turns into the error's `field`.
                return Err(serde::de::Error::custom(format!(
                    "duplicate field `{shown}`"
                )));
            }
            let value = map.next_value_seed(UniqueKeys)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A page of tasks, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"tasks": [], "next_cursor": null}))]
pub struct TaskPage {
    /// The tasks: at most `limit`, and at most 4 MiB of them.
    pub tasks: Vec<TaskView>,
    /// Pass as `cursor` for the next page; `null` on the last page. A page cut by its
    /// byte budget may hold fewer than `limit` tasks and still have one.
    pub next_cursor: Option<String>,
}

/// Filters of `GET /v1/tasks`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this status.
    pub status: Option<String>,
    /// Only this command type.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub command_type: Option<String>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only tasks created at or after this instant (RFC 3339).
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks created before this instant (RFC 3339).
    pub created_before: Option<DateTime<Utc>>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// How long `wait` may hold the request.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Milliseconds to wait for a final status (default 30 000, capped by the server's
    /// `wait_max`).
    pub timeout_ms: Option<u64>,
}

/// What `wait` found.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WaitResponse {
    /// `true` when the task reached a final status (`succeeded`, `dead`, `cancelled`);
    /// `false` when the wait timed out first.
    pub finished: bool,
    /// The task as it stands.
    pub task: TaskView,
}

/// One attempt of a task.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"attempt": 1, "epoch": 1, "worker": "host-1:42", "started_at": "2026-01-01T10:00:00Z", "finished_at": "2026-01-01T10:00:01Z", "outcome": "succeeded", "error": null}))]
pub struct AttemptView {
    /// Attempt number.
    pub attempt: u32,
    /// Lease epoch it ran under.
    pub epoch: i64,
    /// The worker that ran it.
    pub worker: String,
    /// Started (UTC).
    pub started_at: DateTime<Utc>,
    /// Ended (UTC).
    pub finished_at: Option<DateTime<Utc>>,
    /// `running`, `succeeded`, `failed`, ...
    pub outcome: String,
    /// Its error.
    pub error: Option<String>,
}

impl From<&AttemptRecord> for AttemptView {
    fn from(a: &AttemptRecord) -> Self {
        Self {
            attempt: a.attempt,
            epoch: a.epoch,
            worker: a.worker.clone(),
            started_at: a.started_at,
            finished_at: a.finished_at,
            outcome: a.outcome.as_str().to_owned(),
            error: a.error.clone(),
        }
    }
}

/// A count of tasks.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatusCount {
    /// The status.
    pub status: String,
    /// How many.
    pub count: u64,
}

/// Tasks of one command type by status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TypeCount {
    /// The command type.
    pub command_type: String,
    /// The status.
    pub status: String,
    /// How many.
    pub count: u64,
}

/// One queue's counts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueCounts {
    /// The queue.
    pub queue: String,
    /// Tasks by status.
    pub by_status: Vec<StatusCount>,
    /// Due, unclaimed tasks.
    pub backlog: u64,
    /// How long the oldest due task has waited, in milliseconds.
    pub oldest_due_age_ms: Option<u64>,
}

/// Counts by status, command type and queue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"total": 3, "by_status": [{"status": "pending", "count": 2}, {"status": "succeeded", "count": 1}], "by_type": [{"command_type": "echo", "status": "pending", "count": 2}], "queues": [{"queue": "default", "by_status": [{"status": "pending", "count": 2}], "backlog": 2, "oldest_due_age_ms": 1500}], "oldest_due_age_ms": 1500}))]
pub struct StatsView {
    /// All tasks.
    pub total: u64,
    /// Tasks by status.
    pub by_status: Vec<StatusCount>,
    /// Tasks by command type and status.
    pub by_type: Vec<TypeCount>,
    /// Per queue.
    pub queues: Vec<QueueCounts>,
    /// Age of the oldest due task not yet claimed, in milliseconds.
    pub oldest_due_age_ms: Option<u64>,
}

/// A periodic schedule.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "nightly-report", "cadence": "cron \"0 30 2 * * *\" in Europe/Paris", "missed": "skip", "command_type": "echo", "payload": {}, "queue": "default", "priority": 5, "max_attempts": 5, "timeout_ms": 1800000, "paused": false, "next_fire_at": "2026-01-02T01:30:00Z", "last_tick": null, "created_at": "2026-01-01T10:00:00Z", "updated_at": "2026-01-01T10:00:00Z"}))]
pub struct ScheduleView {
    /// Unique name.
    pub name: String,
    /// The cadence, as text.
    pub cadence: String,
    /// What happens to ticks missed during an outage.
    pub missed: String,
    /// Command type each tick enqueues.
    pub command_type: String,
    /// Its payload.
    pub payload: Value,
    /// Queue of the tasks.
    pub queue: String,
    /// Their priority.
    pub priority: u8,
    /// Their attempt budget.
    pub max_attempts: u32,
    /// Their timeout.
    pub timeout_ms: u64,
    /// A paused schedule fires nothing.
    pub paused: bool,
    /// The next tick (UTC).
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The latest tick fired (UTC).
    pub last_tick: Option<DateTime<Utc>>,
    /// Created (UTC).
    pub created_at: DateTime<Utc>,
    /// Changed (UTC).
    pub updated_at: DateTime<Utc>,
}

impl ScheduleView {
    /// The view of a stored schedule, secrets not yet removed.
    pub fn from_record(s: &ScheduleRecord) -> Self {
        Self {
            name: s.def.name.clone(),
            cadence: s.def.cadence.to_string(),
            missed: s.def.missed.to_string(),
            command_type: s.def.command_type.clone(),
            payload: parse_json_text(&s.def.payload),
            queue: s.def.queue.clone(),
            priority: s.def.priority.get(),
            max_attempts: s.def.max_attempts,
            timeout_ms: u64::try_from(s.def.timeout.as_millis()).unwrap_or(u64::MAX),
            paused: s.paused,
            next_fire_at: s.next_fire_at,
            last_tick: s.last_tick,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

/// A schedule to create (or update, by name). Give `cron` or `every_secs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "nightly-report", "command_type": "echo", "payload": {"report": "daily"}, "cron": "0 30 2 * * *", "timezone": "Europe/Paris"}))]
pub struct ScheduleRequest {
    /// Unique name (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// A command type the server accepts.
    pub command_type: String,
    /// Payload of each task (default `{}`). An object with the same key twice is
    /// refused.
    #[serde(default = "empty_object", deserialize_with = "unique_keys")]
    pub payload: Value,
    /// Cron expression: 5 fields, or 6 with seconds first.
    pub cron: Option<String>,
    /// IANA time zone of the cron expression (default UTC).
    pub timezone: Option<String>,
    /// Fixed interval in whole seconds (instead of `cron`).
    pub every_secs: Option<u64>,
    /// After an outage, fire the latest N missed ticks (1 to 1000).
    pub catch_up: Option<u32>,
    /// Queue of the tasks (default `default`).
    pub queue: Option<String>,
    /// Priority 0 to 9 (default 5).
    pub priority: Option<i64>,
    /// Attempt budget (default 5).
    pub max_attempts: Option<i64>,
    /// Per-attempt timeout in milliseconds (default 30 minutes).
    pub timeout_ms: Option<i64>,
}

/// A queue with its controls and counts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "reports", "paused": true, "max_running": null, "waiting": 12, "running": 0, "updated_at": "2026-01-01T10:00:00Z", "max_pending": 10000}))]
pub struct QueueView {
    /// Queue name.
    pub name: String,
    /// A paused queue is not claimed from.
    pub paused: bool,
    /// Most tasks running at once across nodes.
    pub max_running: Option<u32>,
    /// Tasks pending or retrying.
    pub waiting: u64,
    /// Tasks running.
    pub running: u64,
    /// Controls last changed (UTC).
    pub updated_at: Option<DateTime<Utc>>,
    /// This server's limit on waiting tasks (429 beyond it).
    pub max_pending: Option<u64>,
}

impl QueueView {
    pub(crate) fn new(q: &QueueInfo, max_pending: Option<u64>) -> Self {
        Self {
            name: q.name.clone(),
            paused: q.paused,
            max_running: q.max_running,
            waiting: q.waiting,
            running: q.running,
            updated_at: q.updated_at,
            max_pending,
        }
    }
}

/// A queue's limit on running tasks, to set.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_running": 4}))]
pub struct QueueLimitRequest {
    /// At most this many of the queue's tasks run at once across all nodes (1 to
    /// 2147483647). A limit lower than what runs now lets the running tasks finish and
    /// stops claims until the queue is under it.
    #[schema(minimum = 1, maximum = 2147483647)]
    pub max_running: i64,
}

/// A rate limit on one command type: a token bucket shared by every node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"command_type": "echo", "per_second": 2.5, "burst": 3}))]
pub struct RateLimitView {
    /// The command type it limits.
    pub command_type: String,
    /// Tasks started per second in the long run.
    pub per_second: f64,
    /// Tasks that may start at once after a quiet spell.
    pub burst: u32,
}

impl From<&RateLimit> for RateLimitView {
    fn from(limit: &RateLimit) -> Self {
        Self {
            command_type: limit.command_type.clone(),
            per_second: limit.per_second,
            burst: limit.burst,
        }
    }
}

/// A rate limit to set on a command type (or to change: the bucket keeps its tokens,
/// at most the new burst).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"per_second": 2.5, "burst": 10}))]
pub struct RateLimitRequest {
    /// Tasks started per second in the long run: above 0, at most 1000000.
    #[schema(exclusive_minimum = 0.0, maximum = 1000000.0)]
    pub per_second: f64,
    /// Tasks that may start at once after a quiet spell, 1 to 1000000 (default: the
    /// rate rounded up, at least 1).
    #[schema(minimum = 1, maximum = 1000000)]
    pub burst: Option<i64>,
}

/// An event rule: tasks inserted in this queue and of this command type write task
/// events (`null`: any).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventRuleView {
    /// Only tasks of this queue, or any (`null`).
    pub queue: Option<String>,
    /// Only tasks of this command type, or any (`null`).
    pub command_type: Option<String>,
    /// When the rule was added (UTC).
    pub created_at: DateTime<Utc>,
}

impl From<&EventRule> for EventRuleView {
    fn from(rule: &EventRule) -> Self {
        Self {
            queue: rule.queue.clone(),
            command_type: rule.command_type.clone(),
            created_at: rule.created_at,
        }
    }
}

/// The event rules, and where the event stream stands.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"rules": [{"queue": "billing", "command_type": null, "created_at": "2026-01-01T10:00:00Z"}], "head": 1200, "pruned_through": 800}))]
pub struct EventRulesView {
    /// Every rule, by queue then command type (any first). Without rules no task
    /// writes events.
    pub rules: Vec<EventRuleView>,
    /// The last position given so far (the stream's head).
    pub head: i64,
    /// Every position up to this one was pruned.
    pub pruned_through: i64,
}

/// Turn an event rule on or off. Tasks inserted from then on follow the rules; tasks
/// already inserted keep what was decided at their insert.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"queue": "billing", "enabled": true}))]
pub struct EventRuleRequest {
    /// Only tasks of this queue (absent or `null`: any queue).
    #[serde(default)]
    pub queue: Option<String>,
    /// Only tasks of this command type (absent or `null`: any type).
    #[serde(default)]
    pub command_type: Option<String>,
    /// `true` adds the rule (or keeps it), `false` removes it.
    pub enabled: bool,
}

/// A probe's answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub struct Health {
    /// `ok`.
    pub status: String,
}

/// Which tasks a bulk action touches; every field given must match.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BulkFilter {
    /// Only these statuses (empty: any).
    #[serde(default)]
    pub statuses: Vec<String>,
    /// Only this command type.
    pub command_type: Option<String>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only these ids (at most 10 000).
    pub ids: Option<Vec<i64>>,
    /// Only tasks created at or after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks created before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

/// A bulk action: a filter, a bound, and for reprioritise the new priority.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"statuses": ["dead"], "command_type": "echo", "created_after": "2026-01-01T00:00:00Z"}, "limit": 500}))]
pub struct BulkRequest {
    /// Which tasks.
    #[serde(default)]
    pub filter: BulkFilter,
    /// At most this many tasks change (1 to 100 000, default 1000).
    pub limit: Option<u32>,
    /// The new priority (reprioritise only), 0 to 9.
    pub priority: Option<i64>,
}

/// What a bulk action changed.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"changed": 12, "cancel_requested": 2}))]
pub struct BulkResponse {
    /// Tasks whose state changed.
    pub changed: u64,
    /// Running tasks asked to stop (cancel only).
    pub cancel_requested: u64,
}

/// Filters of `GET /v1/audit`.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this actor (a token's name).
    pub actor: Option<String>,
    /// Only this action, e.g. `task.retry`.
    pub action: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One operator action.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditView {
    /// Sequence number.
    pub id: i64,
    /// When (database clock, UTC).
    pub at: DateTime<Utc>,
    /// Who: the token's name.
    pub actor: String,
    /// What, e.g. `task.retry`, `tasks.bulk_cancel`, `queue.pause`.
    pub action: String,
    /// On what: a task id, a schedule or queue name, `tasks` for a bulk action.
    pub target: String,
    /// Details (filter, counts, ...).
    pub details: Value,
}

/// A page of the audit trail, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"entries": [{"id": 7, "at": "2026-01-01T10:00:00Z", "actor": "ops", "action": "task.retry", "target": "42", "details": {}}], "next_cursor": null}))]
pub struct AuditPage {
    /// The entries.
    pub entries: Vec<AuditView>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}
