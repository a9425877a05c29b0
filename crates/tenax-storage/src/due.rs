//! How many tasks of one type are due: what a batch command's worker asks before it
//! claims, to decide whether a batch is full or has waited long enough.
use chrono::{DateTime, Utc};

/// [`Storage::task_due_count`](crate::Storage::task_due_count).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDueCountParams {
    /// Queues the worker claims from.
    pub queues: Vec<String>,
    /// The command type.
    pub command_type: String,
    /// The highest payload version the worker decodes: as in
    /// [`TaskClaimParams::commands`](crate::TaskClaimParams::commands), tasks of newer
    /// versions are not counted.
    pub version: u32,
    /// Count at most this many (the batch size).
    pub limit: u32,
    /// Clock override.
    pub now: Option<DateTime<Utc>>,
}

/// What [`Storage::task_due_count`](crate::Storage::task_due_count) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueCount {
    /// Due waiting tasks, at most the limit asked.
    pub due: u32,
    /// When the oldest of them became due (its run time), if any is due.
    pub oldest_due_at: Option<DateTime<Utc>>,
    /// The database's now (or the override) the count was taken at.
    pub now: DateTime<Utc>,
}
