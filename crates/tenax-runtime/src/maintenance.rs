//! Background services every worker runs by default: the reaper and the pruner.
//!
//! Both are single conditional statements, so several workers running them at once is
//! harmless: a task is reaped or deleted by exactly one of them.
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tenax_storage::{Storage, TaskPruneParams, TaskReapParams};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::WorkerConfig;

/// Most tasks reaped per statement.
pub const REAP_BATCH: u32 = 1000;

/// Sleep about `interval` (±20 %), so that workers started together spread out.
pub(crate) async fn jittered(interval: Duration, stop: &CancellationToken) -> bool {
    let wait = rand::rng().random_range(interval.mul_f64(0.8)..=interval.mul_f64(1.2));
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = sleep(wait) => true,
    }
}

/// Return tasks whose lease expired to `retrying` (or `dead` when out of attempts).
pub(crate) async fn reaper_loop(
    storage: Arc<dyn Storage>,
    interval: Duration,
    stop: CancellationToken,
) {
    while jittered(interval, &stop).await {
        match storage
            .task_reap_expired(&TaskReapParams {
                limit: REAP_BATCH,
                now: None,
            })
            .await
        {
            Ok(reaped) if !reaped.is_empty() => {
                for task in &reaped {
                    crate::metrics::reaped(task.status);
                    info!(task.id = %task.id, status = %task.status, "lease expired; task reaped");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "reaper pass failed"),
        }
    }
}

/// Delete finished tasks older than the retention, in bounded batches.
pub(crate) async fn pruner_loop(
    storage: Arc<dyn Storage>,
    config: WorkerConfig,
    stop: CancellationToken,
) {
    while jittered(config.pruner_interval, &stop).await {
        loop {
            let pruned = storage
                .task_prune(&TaskPruneParams {
                    retention: config.retention,
                    limit: config.prune_batch,
                    now: None,
                })
                .await;
            match pruned {
                Ok(n) if n == u64::from(config.prune_batch) && !stop.is_cancelled() => continue,
                Ok(n) => {
                    if n > 0 {
                        info!(deleted = n, "pruned finished tasks");
                    }
                    break;
                }
                Err(e) => {
                    warn!(error = %e, "pruner pass failed");
                    break;
                }
            }
        }
    }
}
