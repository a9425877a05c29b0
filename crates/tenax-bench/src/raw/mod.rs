//! The raw-SQL baselines and table fillers of `tenax bench`, one module per backend,
//! and what they share. They write the tables Tenax's migrations made, through the
//! connection pools of the storages the bench opened; nothing here is used by workers
//! or clients.
use chrono::{DateTime, Utc};

pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod sqlite;

/// What the tasks table holds after a run: counts and the database-clock window from
/// the first start to the last finish of the succeeded tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Tasks that succeeded.
    pub(crate) succeeded: u64,
    /// Tasks in any other status.
    pub(crate) other: u64,
    /// The earliest `started_at` of a succeeded task.
    pub(crate) first_start: Option<DateTime<Utc>>,
    /// The latest `finished_at` of a succeeded task.
    pub(crate) last_finish: Option<DateTime<Utc>>,
}

impl Window {
    /// Seconds from the first start to the last finish (zero when nothing ran).
    pub(crate) fn seconds(&self) -> f64 {
        match (self.first_start, self.last_finish) {
            (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
            _ => 0.0,
        }
    }
}
