//! The sampler: reads counts by queue and status, backlogs and oldest ages, and the
//! outbox's undelivered rows from the database at a bounded rate and sets the gauges.
//!
//! Every node that exports metrics runs its own sampler (no election): each reads the
//! same database, so every node reports the same, cluster-wide values, and a
//! dashboard takes `max by (queue, status)` over nodes. The cost is one grouped
//! read-only statement per node per interval, and one over the outbox.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tenax_core::TaskStatus;
use tenax_storage::{OutboxKind, OutboxStatsParams, QueueStatsParams, Storage, StorageError};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::names;

/// Default time between two samples.
pub const SAMPLE_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// Read the database once and set the sampled gauges. `seen` holds the queues set
/// before: a queue that has no task any more is set to zero rather than left stale.
pub async fn sample_once(
    storage: &dyn Storage,
    seen: &mut BTreeSet<String>,
) -> Result<(), StorageError> {
    let queues = storage.queue_stats(&QueueStatsParams::default()).await?;
    let current: BTreeSet<String> = queues.iter().map(|q| q.queue.clone()).collect();
    for gone in seen.difference(&current) {
        for status in TaskStatus::ALL {
            ::metrics::gauge!(names::TASKS, "queue" => gone.clone(), "status" => status.as_str())
                .set(0.0);
        }
        ::metrics::gauge!(names::QUEUE_BACKLOG, "queue" => gone.clone()).set(0.0);
        ::metrics::gauge!(names::QUEUE_OLDEST_DUE_AGE, "queue" => gone.clone()).set(0.0);
    }
    for queue in &queues {
        for status in TaskStatus::ALL {
            ::metrics::gauge!(names::TASKS, "queue" => queue.queue.clone(), "status" => status.as_str())
                .set(queue.count(status) as f64);
        }
        ::metrics::gauge!(names::QUEUE_BACKLOG, "queue" => queue.queue.clone())
            .set(queue.backlog as f64);
        let age = queue.oldest_due_age.unwrap_or_default().as_secs_f64();
        ::metrics::gauge!(names::QUEUE_OLDEST_DUE_AGE, "queue" => queue.queue.clone()).set(age);
    }
    seen.extend(current);
    let outbox = storage.outbox_stats(&OutboxStatsParams::default()).await?;
    for kind in [OutboxKind::Callback, OutboxKind::Death, OutboxKind::Alert] {
        let stat = outbox.iter().find(|s| s.kind == kind);
        ::metrics::gauge!(names::OUTBOX_PENDING, "kind" => kind.as_str())
            .set(stat.map_or(0.0, |s| s.pending as f64));
        ::metrics::gauge!(names::OUTBOX_OLDEST_AGE, "kind" => kind.as_str())
            .set(stat.map_or(0.0, |s| s.oldest_age.as_secs_f64()));
    }
    let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
    ::metrics::gauge!(names::SAMPLE_TIMESTAMP).set(now);
    Ok(())
}

/// Sample every `interval` until `stop` is cancelled; a failed sample is logged and the
/// gauges keep their last values (`tenax_sampler_last_success_timestamp_seconds`
/// shows how old they are).
pub async fn sampler_loop(storage: Arc<dyn Storage>, interval: Duration, stop: CancellationToken) {
    let mut seen = BTreeSet::new();
    loop {
        if let Err(e) = sample_once(storage.as_ref(), &mut seen).await {
            warn!(error = %e, "metrics sample failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
