//! One parameter struct per [`Storage`](crate::Storage) method, so adding a field
//! breaks no caller.
//!
//! Every `now` field overrides the database clock for that call (tests move time that
//! way); `None`, the normal case, means the database's own clock.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{CompensationState, Priority, TaskId, TaskNo, TaskRecord, TaskStatus};

/// Names a task by id or by business number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskRef {
    /// By database id.
    Id(TaskId),
    /// By `task_no`.
    No(TaskNo),
}

impl std::fmt::Display for TaskRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskRef::Id(id) => write!(f, "#{id}"),
            TaskRef::No(no) => write!(f, "{no:?}"),
        }
    }
}

/// When a new task may first run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAt {
    /// As soon as possible.
    #[default]
    Now,
    /// After a delay from the database's now.
    In(Duration),
    /// At an instant (UTC).
    At(DateTime<Utc>),
}

/// [`Storage::task_insert`](crate::Storage::task_insert).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInsertParams {
    /// Business number (idempotency key).
    pub task_no: TaskNo,
    /// Command type name.
    pub command_type: String,
    /// Context as JSON text (must parse as JSON).
    pub payload: String,
    /// The payload's shape version, at least 1 (the enqueuer's
    /// [`Command::VERSION`](tenax_core::Command::VERSION)). A repeat of an existing
    /// `task_no` is the same task whatever its version, as long as the type and payload
    /// match: the stored version is kept.
    pub payload_version: u32,
    /// Queue.
    pub queue: String,
    /// Priority.
    pub priority: Priority,
    /// Attempt budget (at least 1).
    pub max_attempts: u32,
    /// Per-attempt timeout.
    pub timeout: Duration,
    /// First run time.
    pub run_at: RunAt,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
    /// Business key: at most `concurrency_limit` tasks with this key run at once, across
    /// all nodes (at most [`CONCURRENCY_KEY_MAX_BYTES`](crate::CONCURRENCY_KEY_MAX_BYTES)).
    pub concurrency_key: Option<String>,
    /// The key's limit, 1..=[`CONCURRENCY_LIMIT_MAX`](crate::CONCURRENCY_LIMIT_MAX)
    /// (ignored without a key; 1 is the usual value).
    pub concurrency_limit: u32,
    /// Where to POST the task's final outcome (an `http` or `https` URL of at most
    /// [`CALLBACK_URL_MAX_BYTES`](crate::CALLBACK_URL_MAX_BYTES)); see [`crate::outbox`].
    /// Not part of the task's identity: a repeat of a `task_no` keeps the stored URL.
    pub callback_url: Option<String>,
    /// The name of the API token enqueueing the task (at most
    /// [`CREATED_BY_MAX_BYTES`](crate::CREATED_BY_MAX_BYTES), not empty), or `None`. Not
    /// part of the task's identity: a repeat of a `task_no` keeps the stored name.
    pub created_by: Option<String>,
}

/// What [`Storage::task_insert`](crate::Storage::task_insert) did.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInserted {
    /// The task, new or existing.
    pub task: TaskRecord,
    /// `false` when the `task_no` existed with the same type and payload.
    pub created: bool,
}

/// [`Storage::task_list`](crate::Storage::task_list).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskListParams {
    /// Only this status.
    pub status: Option<TaskStatus>,
    /// Only this command type.
    pub command_type: Option<String>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only ids below this one (cursor for newest-first pages).
    pub before_id: Option<TaskId>,
    /// At most this many (newest first).
    pub limit: u32,
    /// Only tasks first claimed before this instant (with `status: running`, the tasks
    /// running longer than `now - started_before`).
    pub started_before: Option<DateTime<Utc>>,
    /// Only tasks created at or after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks created before this instant.
    pub created_before: Option<DateTime<Utc>>,
    /// Leave out a payload or result longer than this many bytes: it is not read from
    /// the database, and the record holds the empty string in its place (`payload`
    /// `""`, `result` `Some("")`), which no stored value is (both are JSON). A list
    /// answer can then be bounded without loading large values. `None`: every value
    /// whole.
    pub value_max_bytes: Option<u32>,
}

/// [`Storage::task_list_finished`](crate::Storage::task_list_finished).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskListFinishedParams {
    /// Only tasks that finished at or after this instant.
    pub since: DateTime<Utc>,
    /// At most this many, the latest to finish first.
    pub limit: u32,
}

/// [`Storage::task_claim_batch`](crate::Storage::task_claim_batch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskClaimParams {
    /// The claiming worker's id, recorded as lease owner.
    pub worker: String,
    /// Queues to claim from.
    pub queues: Vec<String>,
    /// The commands the worker can run: each type name with the highest payload
    /// version it decodes. A task is claimed only if its type is listed and its
    /// `payload_version` is at most that version; other tasks wait for a worker that
    /// knows them. Each type at most once.
    pub commands: Vec<(String, u32)>,
    /// At most this many.
    pub limit: u32,
    /// Lease length from the database's now.
    pub lease_ttl: Duration,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// A lease a worker holds: the task and the epoch it was claimed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The task.
    pub id: TaskId,
    /// Its lease epoch at claim.
    pub epoch: i64,
}

/// [`Storage::lease_extend`](crate::Storage::lease_extend).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseExtendParams {
    /// Leases to renew.
    pub leases: Vec<Lease>,
    /// New expiry: the database's now plus this.
    pub lease_ttl: Duration,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskCompleteParams {
    /// The lease being completed.
    pub lease: Lease,
    /// The result, as JSON text.
    pub result: Option<String>,
    /// For a compensation task: what to record on the compensated task
    /// ([`CompensationState::Succeeded`], or [`CompensationState::None`] when the
    /// command defines no compensation). Ignored for other tasks.
    pub compensation: CompensationState,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// What [`Storage::task_complete_many_if_leased`](crate::Storage::task_complete_many_if_leased)
/// did with one completion of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchCompletion {
    /// Written with the batch: the task succeeded.
    Landed,
    /// The lease was lost (the task is no longer `running` under that epoch, or the
    /// lease was named earlier in the batch): nothing was written.
    Lost,
    /// Not written: the lease holds, but the task's completion moves other tasks (a
    /// workflow task or a compensation), so it is left to
    /// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased),
    /// in a transaction of its own that holds rows shared with other workers' tasks
    /// only briefly.
    Alone,
}

/// What happens after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailNext {
    /// Retry no sooner than this delay from the database's now.
    Retry(Duration),
    /// The task is dead (its compensation is scheduled).
    Dead,
    /// The worker gives the task back unfinished (shutdown): retry now, and the attempt
    /// is not counted against the budget.
    HandBack,
    /// The handler stopped after a cancel request: the task is `cancelled`.
    Cancelled,
}

/// [`Storage::task_fail_if_leased`](crate::Storage::task_fail_if_leased).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailParams {
    /// The lease that failed.
    pub lease: Lease,
    /// The error, stored in the task and its attempt history (truncated to 4 KiB).
    pub error: String,
    /// Retry or die.
    pub next: FailNext,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::task_reap_expired`](crate::Storage::task_reap_expired).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskReapParams {
    /// At most this many tasks per call.
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
    /// Also reap running tasks whose lease expires after this time: leases granted
    /// before the database clock stepped back, and not renewed since (the reaper's
    /// clock watch decides when that holds). `None` reaps expired leases only.
    ///
    /// With `now` given, the bound keeps its distance from `now` but counts from the
    /// database clock the statement reads, when that is later: a caller that read the
    /// clock, then waited for a connection, must not take a lease granted meanwhile for
    /// one granted before the step.
    pub expires_beyond: Option<DateTime<Utc>>,
}

/// A task the reaper moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReapedTask {
    /// The task.
    pub id: TaskId,
    /// Its new status (`retrying`, `dead`, or `cancelled` after a cancel request).
    pub status: TaskStatus,
}

/// [`Storage::task_cancel`](crate::Storage::task_cancel) and
/// [`Storage::task_retry`](crate::Storage::task_retry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskActionParams {
    /// The task.
    pub task: TaskRef,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::task_prune`](crate::Storage::task_prune).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPruneParams {
    /// Delete tasks finished longer ago than this.
    pub retention: Duration,
    /// At most this many per call.
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// Counts from [`Storage::stats`](crate::Storage::stats).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    /// Tasks by status.
    pub by_status: Vec<(TaskStatus, u64)>,
    /// Tasks by command type and status.
    pub by_type: Vec<(String, TaskStatus, u64)>,
    /// Age of the oldest due task not yet claimed, if any.
    pub oldest_due_age: Option<Duration>,
}

impl Stats {
    /// The count for one status.
    pub fn count(&self, status: TaskStatus) -> u64 {
        self.by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }

    /// All tasks.
    pub fn total(&self) -> u64 {
        self.by_status.iter().map(|(_, n)| n).sum()
    }
}

/// [`Storage::task_next_run_at`](crate::Storage::task_next_run_at).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskNextRunParams {
    /// Queues the worker claims from.
    pub queues: Vec<String>,
    /// The commands the worker can run, as in [`TaskClaimParams::commands`].
    pub commands: Vec<(String, u32)>,
    /// Also report tasks that fell due this long before now: the time since the
    /// caller's last claim, so a task that fell due between that claim and this call
    /// is reported (as due) instead of skipped. Tasks due before that are the claim's
    /// business (or not claimable by this caller) and are not reported.
    pub since: Duration,

    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// A schedule as stored: its definition and where it stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// What it fires and when.
    pub def: tenax_core::ScheduleDef,
    /// A paused schedule fires nothing; its ticks while paused are skipped.
    pub paused: bool,
    /// The next tick it fires (UTC); `None` when it never fires again.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The latest tick it fired, if any.
    pub last_tick: Option<DateTime<Utc>>,
    /// When it was first stored.
    pub created_at: DateTime<Utc>,
    /// When it last changed (definition, pause, or a firing).
    pub updated_at: DateTime<Utc>,
}

/// [`Storage::schedule_upsert`](crate::Storage::schedule_upsert).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleUpsertParams {
    /// The definition (checked again by the storage).
    pub def: tenax_core::ScheduleDef,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::queue_backlog`](crate::Storage::queue_backlog).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueBacklogParams {
    /// The queues to measure.
    pub queues: Vec<String>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// The due backlog of one queue: waiting tasks whose run time has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueBacklog {
    /// The queue.
    pub queue: String,
    /// Due tasks (`pending` or `retrying`, run time reached).
    pub due: u64,
    /// The oldest due task's run time, if any is due.
    pub oldest_due_at: Option<DateTime<Utc>>,
}

/// [`Storage::task_cancel_requested`](crate::Storage::task_cancel_requested).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequestedParams {
    /// The leases a worker holds.
    pub leases: Vec<Lease>,
}

/// What [`Storage::task_next_run_at`](crate::Storage::task_next_run_at) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextRun {
    /// The earliest future run time.
    pub run_at: DateTime<Utc>,
    /// The database's now (or the override) when it was read: `run_at - now` is how
    /// long a worker sleeps, whatever its own clock says.
    pub now: DateTime<Utc>,
}

/// What [`Storage::schedule_upsert`](crate::Storage::schedule_upsert) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleUpserted {
    /// A new schedule; its first tick is the first after now.
    Created,
    /// The definition changed; a changed cadence restarts from the first tick after
    /// now, and a paused schedule stays paused.
    Updated,
    /// The same definition was already stored; nothing was written.
    Unchanged,
}

/// [`Storage::schedule_set_paused`](crate::Storage::schedule_set_paused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulePauseParams {
    /// The schedule.
    pub name: String,
    /// `true` to pause, `false` to resume (from the first tick after now).
    pub paused: bool,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::schedule_fire_due`](crate::Storage::schedule_fire_due).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleFireParams {
    /// At most this many schedules per call (each fires its due ticks).
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
    /// How late a tick of a [`MissedTicks::Skip`](tenax_core::MissedTicks::Skip)
    /// schedule may be and still fire (the worker's `missed_tick_grace`; by default
    /// [`MissedTicks::GRACE`](tenax_core::MissedTicks::GRACE)).
    pub grace: std::time::Duration,
}

/// One tick a [`Storage::schedule_fire_due`](crate::Storage::schedule_fire_due) call
/// fired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredTick {
    /// The schedule.
    pub schedule: String,
    /// The tick (UTC).
    pub tick: DateTime<Utc>,
    /// The task it enqueued, or `None` when a task with the tick's number already
    /// existed (the tick had fired before the schedule was re-created).
    pub task: Option<TaskId>,
}

/// A queue as [`Storage::queue_list`](crate::Storage::queue_list) reports it: its
/// claim controls and how many of its tasks wait and run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's name.
    pub name: String,
    /// A paused queue is never claimed from; its tasks wait.
    pub paused: bool,
    /// At most this many of its tasks run at once across all nodes; `None` is unlimited.
    pub max_running: Option<u32>,
    /// Tasks `pending` or `retrying` (due or not).
    pub waiting: u64,
    /// Tasks `running`.
    pub running: u64,
    /// When its controls last changed (`None` if they were never set).
    pub updated_at: Option<DateTime<Utc>>,
}

/// What [`Storage::queue_update`](crate::Storage::queue_update) changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueChange {
    /// Stop claiming from the queue (running tasks finish).
    Pause,
    /// Claim from the queue again.
    Resume,
    /// At most this many running at once (at least 1); `None` removes the limit.
    MaxRunning(Option<u32>),
}

/// [`Storage::queue_update`](crate::Storage::queue_update).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueUpdateParams {
    /// The queue (need not have tasks yet).
    pub queue: String,
    /// The change.
    pub change: QueueChange,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::queue_stats`](crate::Storage::queue_stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStatsParams {
    /// Clock override (what "due" and the ages are measured against).
    pub now: Option<DateTime<Utc>>,
}

/// One queue's counts from [`Storage::queue_stats`](crate::Storage::queue_stats).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// The queue.
    pub queue: String,
    /// Tasks of the queue by status (statuses with no task are left out).
    pub by_status: Vec<(TaskStatus, u64)>,
    /// Tasks due now and not claimed: `pending` or `retrying` with `run_at` reached.
    pub backlog: u64,
    /// How long the longest-waiting of those has been due, if any.
    pub oldest_due_age: Option<Duration>,
}

impl QueueStats {
    /// The count for one status.
    pub fn count(&self, status: TaskStatus) -> u64 {
        self.by_status
            .iter()
            .find(|(s, _)| *s == status)
            .map_or(0, |(_, n)| *n)
    }
}

/// A token bucket on one command type, as
/// [`Storage::rate_limit_list`](crate::Storage::rate_limit_list) reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    /// The command type it limits.
    pub command_type: String,
    /// Tokens added per second (tasks started per second in the long run).
    pub per_second: f64,
    /// Most tokens the bucket holds (tasks that may start at once after a quiet spell).
    pub burst: u32,
    /// Tokens left at `refilled_at`.
    pub tokens: f64,
    /// When the bucket was last refilled (UTC, database clock).
    pub refilled_at: DateTime<Utc>,
}

impl RateLimit {
    /// The highest rate, in tokens per second.
    pub const PER_SECOND_MAX: f64 = 1e6;
    /// The largest bucket.
    pub const BURST_MAX: u32 = 1_000_000;

    /// The bucket of a limit set without one, by every way in (the HTTP API, `tenax
    /// rate-limits set`): one second's worth of tokens, at least 1.
    pub fn default_burst(per_second: f64) -> u32 {
        if per_second.is_finite() && per_second > 1.0 {
            // At most `BURST_MAX` here, so the cast is exact.
            per_second.ceil().min(f64::from(Self::BURST_MAX)) as u32
        } else {
            1
        }
    }
}

/// [`Storage::rate_limit_set`](crate::Storage::rate_limit_set).
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitSetParams {
    /// The command type (need not have tasks yet).
    pub command_type: String,
    /// Tokens per second, above 0 and at most 1e6.
    pub per_second: f64,
    /// Bucket size, 1..=1e6.
    pub burst: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// Which tasks a bulk action touches. Every set field must match; empty `statuses` = any status.
///
/// The action narrows further: a bulk cancel touches only the statuses a cancel applies
/// to, whatever `statuses` says (see [`BulkAction`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskFilter {
    /// Only these statuses (empty: any).
    pub statuses: Vec<TaskStatus>,
    /// Only this command type.
    pub command_type: Option<String>,
    /// Only this queue.
    pub queue: Option<String>,
    /// Only these ids (at most 10,000; more is `StorageError::Invalid`).
    pub ids: Option<Vec<TaskId>>,
    /// Only tasks created at or after this instant.
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks created before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

/// What [`Storage::task_bulk`](crate::Storage::task_bulk) does to each matching task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// As [`Storage::task_cancel`](crate::Storage::task_cancel): waiting (`pending`,
    /// `retrying`, `blocked`) execute tasks are cancelled; running execute tasks get a
    /// cancel request. Compensation tasks and finished tasks are left alone.
    Cancel,
    /// As [`Storage::task_retry`](crate::Storage::task_retry) for `dead` execute tasks
    /// whose compensation is not running. A dead compensation task is retried one at a
    /// time with `task_retry`, which also re-opens its parent.
    Retry,
    /// Set this priority on waiting (`pending`, `retrying`, `blocked`) tasks.
    Reprioritise(Priority),
}

/// [`Storage::task_bulk`](crate::Storage::task_bulk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskBulkParams {
    /// Which tasks.
    pub filter: TaskFilter,
    /// What to do to them.
    pub action: BulkAction,
    /// At most this many tasks are changed (1..=100_000, else `Invalid`).
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// [`Storage::task_insert_many`](crate::Storage::task_insert_many).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskInsertManyParams {
    /// The tasks, each checked as by
    /// [`Storage::task_insert`](crate::Storage::task_insert) (their own `now` fields are
    /// ignored: the call has one clock).
    pub tasks: Vec<TaskInsertParams>,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// What [`Storage::task_bulk`](crate::Storage::task_bulk) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TaskBulkOutcome {
    /// Tasks whose state changed (cancelled, retried, or reprioritised).
    pub changed: u64,
    /// Running tasks that were asked to stop (bulk cancel only), as `task_cancel` does for one.
    pub cancel_requested: u64,
}

/// [`Storage::audit_append`](crate::Storage::audit_append).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditAppendParams {
    /// Who: the API token's name, or `cli:<os user>` for the CLI.
    pub actor: String,
    /// What, e.g. `task.cancel`, `tasks.bulk_retry`, `schedule.pause`, `queue.resume`.
    pub action: String,
    /// The object acted on, e.g. a task id, a schedule or queue name, or a filter summary.
    pub target: String,
    /// Free-form detail (the filter, counts, ...).
    pub details: serde_json::Value,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// One recorded operator action.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditRecord {
    /// Increasing with each entry.
    pub id: i64,
    /// Database clock, UTC.
    pub at: DateTime<Utc>,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub target: String,
    /// Free-form detail.
    pub details: serde_json::Value,
}

/// [`Storage::audit_list`](crate::Storage::audit_list).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AuditListParams {
    /// Newest first; only ids below this one (cursor).
    pub before_id: Option<i64>,
    /// At most this many (1..=1000, else `Invalid`).
    pub limit: u32,
    /// Only this actor.
    pub actor: Option<String>,
    /// Only this action.
    pub action: Option<String>,
}

/// The decision of [`Storage::task_insert_many_if`](crate::Storage::task_insert_many_if):
/// given every item's outcome inside the transaction, whether to commit it.
pub type InsertAccept<'a> = dyn Fn(&[TaskInsertOutcome]) -> bool + Send + Sync + 'a;

/// What [`Storage::task_insert_many_if`](crate::Storage::task_insert_many_if) did.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInsertManyChecked {
    /// Per item, in the order given: what it did, or, when not `committed`, what it
    /// would have done.
    pub outcomes: Vec<TaskInsertOutcome>,
    /// Whether the transaction committed (the decision accepted the outcomes). When
    /// `false`, nothing was written.
    pub committed: bool,
}

/// What [`Storage::task_insert_many`](crate::Storage::task_insert_many) did with one
/// task, in the order the tasks were given.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskInsertOutcome {
    /// A new task.
    Created(TaskRecord),
    /// The `task_no` existed with the same type and payload: that task.
    Existing(TaskRecord),
    /// The `task_no` existed with another command type or payload (`field`); nothing was
    /// written for this item.
    Conflict {
        /// The task that holds the number.
        existing: TaskRecord,
        /// `command type` or `payload`.
        field: &'static str,
    },
}

impl TaskInsertOutcome {
    /// The task the item names (new, existing, or the one it conflicts with).
    pub fn task(&self) -> &TaskRecord {
        match self {
            TaskInsertOutcome::Created(task) | TaskInsertOutcome::Existing(task) => task,
            TaskInsertOutcome::Conflict { existing, .. } => existing,
        }
    }

    /// Whether the item made a new task.
    pub fn created(&self) -> bool {
        matches!(self, TaskInsertOutcome::Created(_))
    }

    /// The answer [`Storage::task_insert`](crate::Storage::task_insert) gives for it.
    pub fn into_inserted(self) -> crate::Result<TaskInserted> {
        match self {
            TaskInsertOutcome::Created(task) => Ok(TaskInserted {
                task,
                created: true,
            }),
            TaskInsertOutcome::Existing(task) => Ok(TaskInserted {
                task,
                created: false,
            }),
            TaskInsertOutcome::Conflict { existing, field } => {
                Err(crate::StorageError::TaskNoConflict {
                    task_no: existing.task_no.to_string(),
                    field,
                })
            }
        }
    }
}
