//! The heartbeat: renews every held lease (running, buffered, or with an outcome still
//! being written) in one statement per beat. A lease missing from the answer was lost:
//! its handler is stopped at once. A renewal moves each attempt's self-fencing deadline.
use std::sync::Arc;
use std::time::Duration;

use tenax_core::TaskContext;
use tenax_storage::{Lease, LeaseExtendParams};
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Shared;

/// After a failed beat, the next one comes this soon (or at the heartbeat interval, if
/// that is sooner): a worker renews its leases within about this long of its database's
/// return, before they can expire.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(200);

pub(super) async fn heartbeat_loop(shared: Arc<Shared>, stop: CancellationToken) {
    let mut wait = shared.config.heartbeat_interval;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep(wait) => {}
        }
        wait = shared.config.heartbeat_interval;
        crate::metrics::heartbeat();
        let leases: Vec<Lease> = shared.held().keys().copied().collect();
        if leases.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let renewed = shared
            .storage
            .lease_extend(&LeaseExtendParams {
                leases: leases.clone(),
                lease_ttl: shared.config.lease_ttl,
                now: None,
            })
            .await;
        match renewed {
            Ok(renewed) => {
                debug!(
                    asked = leases.len(),
                    renewed = renewed.len(),
                    took_us = sent.elapsed().as_micros() as u64,
                    "leases renewed"
                );
                let deadline = shared.fence_after(sent);
                {
                    let held = shared.held();
                    for lease in leases {
                        let Some(entry) = held.get(&lease) else {
                            continue; // finished meanwhile
                        };
                        if renewed.contains(&lease) {
                            entry.deadline.send_replace(deadline);
                        } else if entry.finishing.load(std::sync::atomic::Ordering::SeqCst)
                            || entry
                                .context
                                .as_ref()
                                .is_some_and(TaskContext::completion_committed)
                        {
                            debug!(task.id = %lease.id, "not renewed: its outcome was just written");
                        } else {
                            warn!(task.id = %lease.id, epoch = lease.epoch, "lease lost; stopping the handler");
                            entry.lost.cancel();
                        }
                    }
                }
                // Asked after the deadlines moved: a slow answer fences nothing.
                let cancels = cancel_requests(&shared, &renewed).await;
                let held = shared.held();
                for lease in &cancels {
                    if let Some(entry) = held.get(lease) {
                        entry.cancel_requested.cancel();
                    }
                }
            }
            // Deadlines stay where they are: if renewals keep failing, the executors
            // fence themselves before the leases expire.
            Err(e) => {
                warn!(worker = %shared.id, error = %e, "heartbeat failed");
                wait = wait.min(RETRY_AFTER_FAILURE);
            }
        }
    }
}

/// The renewed leases whose task has a cancel request (none if the question fails: it
/// is asked again at the next heartbeat).
async fn cancel_requests(shared: &Shared, renewed: &[Lease]) -> Vec<Lease> {
    if renewed.is_empty() {
        return Vec::new();
    }
    let params = tenax_storage::CancelRequestedParams {
        leases: renewed.to_vec(),
    };
    match shared.storage.task_cancel_requested(&params).await {
        Ok(requested) => requested,
        Err(e) => {
            warn!(worker = %shared.id, error = %e, "reading cancel requests failed");
            Vec::new()
        }
    }
}
