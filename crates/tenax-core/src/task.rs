//! The task record and the validated values it is made of.
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::state::TaskStatus;

/// Input that a task cannot be made of, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct InvalidInput {
    /// The field at fault (`task_no`, `priority`, `queue`, ...).
    pub field: &'static str,
    /// Why it was refused.
    pub reason: String,
}

impl InvalidInput {
    /// A refusal of `field` for `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// The database id of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub i64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

fn check_name(field: &'static str, value: &str, max: usize) -> Result<(), InvalidInput> {
    if value.is_empty() {
        return Err(InvalidInput::new(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(InvalidInput::new(
            field,
            format!("is {} bytes long, at most {max} allowed", value.len()),
        ));
    }
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(InvalidInput::new(
            field,
            "must not contain white space or control characters",
        ));
    }
    Ok(())
}

/// The business number of a task: its idempotency key, unique across the table.
///
/// Enqueueing a `task_no` that exists returns the existing task; with a different type
/// or payload it is a conflict. The uniqueness lasts until the finished task is pruned.
/// When the caller gives none, a UUIDv7 is generated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskNo(String);

impl TaskNo {
    /// Longest accepted `task_no`, in bytes. (A compensation task's number is its
    /// parent's followed by `:compensate:<epoch>`, so stored numbers can be longer.)
    pub const MAX_LEN: usize = 160;

    /// The infix reserved for compensation tasks' derived numbers.
    pub const COMPENSATION_INFIX: &'static str = ":compensate:";

    /// A validated `task_no`: 1 to 160 bytes, no white space or control characters,
    /// and not containing the reserved `:compensate:`.
    pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
        let value = value.into();
        check_name("task_no", &value, Self::MAX_LEN)?;
        if value.contains(Self::COMPENSATION_INFIX) {
            return Err(InvalidInput::new(
                "task_no",
                "must not contain \":compensate:\" (reserved for compensation tasks)",
            ));
        }
        Ok(Self(value))
    }

    /// A number read back from storage, which validated it on the way in (and may have
    /// derived it, as for compensation tasks). Not for user input.
    #[doc(hidden)]
    pub fn from_stored(value: String) -> Self {
        Self(value)
    }

    /// A fresh, time-ordered `task_no` (UUIDv7).
    pub fn generate() -> Self {
        Self(uuid::Uuid::now_v7().to_string())
    }

    /// The text of the number.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TaskNo {
    type Error = InvalidInput;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<TaskNo> for String {
    fn from(value: TaskNo) -> Self {
        value.0
    }
}

impl fmt::Display for TaskNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A queue name: 1 to 100 bytes, no white space or control characters, no `/`, and not
/// dots alone (a queue is named in URL paths: `/v1/queues/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueueName(String);

impl QueueName {
    /// The queue tasks go to unless their command or the caller says otherwise.
    pub const DEFAULT: &'static str = "default";

    /// A validated queue name.
    pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
        let value = value.into();
        check_name("queue", &value, 100)?;
        if value.contains('/') || value.chars().all(|c| c == '.') {
            return Err(InvalidInput::new(
                "queue",
                "must not contain / nor be dots alone (. or ..)",
            ));
        }
        Ok(Self(value))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for QueueName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl TryFrom<String> for QueueName {
    type Error = InvalidInput;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<QueueName> for String {
    fn from(value: QueueName) -> Self {
        value.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Validate a command type name: 1 to 100 bytes, no white space or control characters.
pub fn validate_command_type(value: &str) -> Result<(), InvalidInput> {
    check_name("command type", value, 100)
}

/// How much earlier one priority step makes a task's turn: the claim orders due tasks
/// by `run_at − priority × PRIORITY_AGING_STEP` (then id), so priority 9 is served as if
/// it had been due 9 minutes earlier than priority 0.
///
/// This is also the aging rule: a task with priority `p` due at `r` is overtaken only by
/// tasks whose key is smaller, that is tasks due before `r + (9 − p) × STEP` even at
/// priority 9. So however many urgent tasks keep arriving, a task starts at most
/// `(9 − p) × STEP` (at most 9 × STEP, 9 minutes) after it is due, plus the time the
/// workers need to drain the tasks already ahead of it. The backends write this value
/// into their claim index (`migrations/*/0003_claim_controls.sql`).
pub const PRIORITY_AGING_STEP: Duration = Duration::from_secs(60);

/// Task priority, 0 to 9; 9 is the most urgent. Defaults to 5. Priority ages: see
/// [`PRIORITY_AGING_STEP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u8", into = "u8")]
pub struct Priority(u8);

impl Priority {
    /// The least urgent priority.
    pub const MIN: Priority = Priority(0);
    /// The default priority.
    pub const DEFAULT: Priority = Priority(5);
    /// The most urgent priority.
    pub const MAX: Priority = Priority(9);

    /// A validated priority.
    pub fn new(value: u8) -> Result<Self, InvalidInput> {
        if value > 9 {
            return Err(InvalidInput::new(
                "priority",
                format!("{value} is out of range 0-9"),
            ));
        }
        Ok(Self(value))
    }

    /// The number, 0 to 9.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// How long a task of this priority can wait behind more urgent tasks that become
    /// due after it: `(9 − priority) × PRIORITY_AGING_STEP` (plus the time to drain the
    /// tasks already ahead of it).
    pub const fn aging_bound(self) -> Duration {
        Duration::from_secs((Self::MAX.0 - self.0) as u64 * PRIORITY_AGING_STEP.as_secs())
    }
}

impl Default for Priority {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u8> for Priority {
    type Error = InvalidInput;
    fn try_from(value: u8) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<Priority> for u8 {
    fn from(value: Priority) -> Self {
        value.0
    }
}

/// Whether a task runs a command's `execute` or its `compensate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// The command itself.
    Execute,
    /// The compensation of a dead task (linked to it by `parent_id`).
    Compensate,
}

impl TaskKind {
    /// The name stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            TaskKind::Execute => "execute",
            TaskKind::Compensate => "compensate",
        }
    }

    /// Parse a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "execute" => Some(TaskKind::Execute),
            "compensate" => Some(TaskKind::Compensate),
            _ => None,
        }
    }
}

/// The compensation state of a dead task, shown on the task itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationState {
    /// The compensation task waits or runs.
    Pending,
    /// The compensation finished successfully (recorded exactly once).
    Succeeded,
    /// The compensation itself died.
    Failed,
    /// The command defines no compensation.
    None,
}

impl CompensationState {
    /// The name stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            CompensationState::Pending => "pending",
            CompensationState::Succeeded => "succeeded",
            CompensationState::Failed => "failed",
            CompensationState::None => "none",
        }
    }

    /// Parse a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "pending" => Some(CompensationState::Pending),
            "succeeded" => Some(CompensationState::Succeeded),
            "failed" => Some(CompensationState::Failed),
            "none" => Some(CompensationState::None),
            _ => None,
        }
    }
}

/// A task as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Database id.
    pub id: TaskId,
    /// Business number, unique.
    pub task_no: TaskNo,
    /// Whether this task executes or compensates its command.
    pub kind: TaskKind,
    /// For a compensation task, the dead task it compensates.
    pub parent_id: Option<TaskId>,
    /// Stable command type name.
    pub command_type: String,
    /// The command's context, as JSON text.
    pub payload: String,
    /// The shape version of the payload ([`Command::VERSION`](crate::Command::VERSION)
    /// of the enqueuer), at least 1. Absent in JSON written before versions existed,
    /// which means 1.
    #[serde(default = "first_payload_version")]
    pub payload_version: u32,
    /// Queue.
    pub queue: String,
    /// Priority 0-9.
    pub priority: Priority,
    /// Status.
    pub status: TaskStatus,
    /// Claims so far in the current attempt budget (counted at claim time).
    pub attempt: u32,
    /// Attempt budget.
    pub max_attempts: u32,
    /// Fencing token, incremented at every claim; never reset.
    pub lease_epoch: i64,
    /// The worker holding the lease, while running.
    pub lease_owner: Option<String>,
    /// When the lease expires (database clock), while running.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Earliest time of the next run (database clock).
    pub run_at: DateTime<Utc>,
    /// Per-attempt timeout, in milliseconds.
    pub timeout_ms: u64,
    /// The last error.
    pub last_error: Option<String>,
    /// The handler's result, as JSON text.
    pub result: Option<String>,
    /// Compensation state, once dead.
    pub compensation: Option<CompensationState>,
    /// When the task was enqueued.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// First claim.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a finished status.
    pub finished_at: Option<DateTime<Utc>>,
    /// The business key this task shares a concurrency limit with, if any.
    #[serde(default)]
    pub concurrency_key: Option<String>,
    /// With a key: at most this many tasks of the key run at once (this one included).
    #[serde(default = "first_payload_version")]
    pub concurrency_limit: u32,
    /// The name of the API token that enqueued the task through the HTTP API; `None`
    /// for a task enqueued otherwise (the library, the CLI, a schedule, a
    /// compensation) or by a server without tokens.
    #[serde(default)]
    pub created_by: Option<String>,
}

fn first_payload_version() -> u32 {
    1
}

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Still running (or its worker died and the reaper has not run yet).
    Running,
    /// The handler succeeded.
    Succeeded,
    /// The handler failed; the task was retried.
    Failed,
    /// The handler failed and the task died.
    Dead,
    /// The lease expired (worker crashed, hung or lost the database).
    LeaseExpired,
}

impl AttemptOutcome {
    /// The name stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Dead => "dead",
            AttemptOutcome::LeaseExpired => "lease_expired",
        }
    }

    /// Parse a stored name.
    pub fn parse(value: &str) -> Option<Self> {
        [
            AttemptOutcome::Running,
            AttemptOutcome::Succeeded,
            AttemptOutcome::Failed,
            AttemptOutcome::Dead,
            AttemptOutcome::LeaseExpired,
        ]
        .into_iter()
        .find(|o| o.as_str() == value)
    }
}

/// One entry of a task's bounded attempt history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The task.
    pub task_id: TaskId,
    /// The lease epoch of this attempt (unique per task).
    pub epoch: i64,
    /// Attempt number within its budget.
    pub attempt: u32,
    /// The worker that ran it.
    pub worker: String,
    /// Claim time.
    pub started_at: DateTime<Utc>,
    /// End time.
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error, if it failed.
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_no_is_validated() {
        assert!(TaskNo::new("ACC-1").is_ok());
        assert_eq!(TaskNo::new("").unwrap_err().field, "task_no");
        assert!(TaskNo::new("a b").is_err());
        assert!(TaskNo::new("a\u{0}").is_err());
        assert!(TaskNo::new("x".repeat(TaskNo::MAX_LEN + 1)).is_err());
        assert!(TaskNo::new("x".repeat(TaskNo::MAX_LEN)).is_ok());
        assert!(TaskNo::new("A:compensate:1").is_err());
        assert_ne!(TaskNo::generate(), TaskNo::generate());
    }

    #[test]
    fn queue_names_that_are_path_segments_or_make_them_are_refused() {
        for bad in [".", "..", "...", "a/b", "/", "../x", ""] {
            let err = QueueName::new(bad).unwrap_err();
            assert_eq!(err.field, "queue", "{bad}");
        }
        for good in ["default", "a.b", ".hidden", "reports-2026", "a:b"] {
            assert!(QueueName::new(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn priority_is_bounded() {
        assert_eq!(Priority::default().get(), 5);
        assert!(Priority::new(9).is_ok());
        assert!(Priority::new(10).is_err());
        assert!(serde_json::from_str::<Priority>("12").is_err());
    }
}
