//! What the backends' `bench` modules share (feature `bench`).
use chrono::{DateTime, Utc};

/// What the tasks table holds after a run: counts and the database-clock window from
/// the first start to the last finish of the succeeded tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks in any other status.
    pub other: u64,
    /// The earliest `started_at` of a succeeded task.
    pub first_start: Option<DateTime<Utc>>,
    /// The latest `finished_at` of a succeeded task.
    pub last_finish: Option<DateTime<Utc>>,
}

impl Window {
    /// Seconds from the first start to the last finish (zero when nothing ran).
    pub fn seconds(&self) -> f64 {
        match (self.first_start, self.last_finish) {
            (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
            _ => 0.0,
        }
    }
}
