//! Folding the per-(queue, status) rows every backend reads for
//! [`Storage::queue_stats`](crate::Storage::queue_stats) into one entry per queue.
use std::time::Duration;

use tenax_core::TaskStatus;

use crate::params::QueueStats;

/// One `GROUP BY queue, status` row: the count, how many of them are due and
/// unclaimed, and how long the oldest of those has been due.
pub(crate) struct QueueStatusRow {
    pub(crate) queue: String,
    pub(crate) status: TaskStatus,
    pub(crate) count: u64,
    pub(crate) due: u64,
    pub(crate) oldest_due_age: Option<Duration>,
}

/// Rows to one entry per queue, queues in name order, statuses in their order.
pub(crate) fn fold(rows: Vec<QueueStatusRow>) -> Vec<QueueStats> {
    let mut queues: Vec<QueueStats> = Vec::new();
    for row in rows {
        let index = match queues.iter().position(|q| q.queue == row.queue) {
            Some(index) => index,
            None => {
                queues.push(QueueStats {
                    queue: row.queue.clone(),
                    ..QueueStats::default()
                });
                queues.len() - 1
            }
        };
        let entry = &mut queues[index];
        entry.by_status.push((row.status, row.count));
        if matches!(row.status, TaskStatus::Pending | TaskStatus::Retrying) {
            entry.backlog += row.due;
            entry.oldest_due_age = match (entry.oldest_due_age, row.oldest_due_age) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    for entry in &mut queues {
        entry.by_status.sort();
    }
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    queues
}

/// Milliseconds (possibly negative or fractional from SQL arithmetic) to a duration.
pub(crate) fn age_from_ms(ms: f64) -> Duration {
    Duration::try_from_secs_f64((ms / 1000.0).max(0.0)).unwrap_or(Duration::MAX)
}
