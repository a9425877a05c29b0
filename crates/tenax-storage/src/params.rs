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
}

/// A task the reaper moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReapedTask {
    /// The task.
    pub id: TaskId,
    /// Its new status (`retrying` or `dead`).
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
