//! The due backlog of each queue, sampled at most once per second per queue, for
//! load-aware retry policies.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tenax_storage::{QueueBacklogParams, Storage};
use tokio::time::Instant;
use tracing::warn;

/// How long a sample stays fresh.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Recent samples of the due backlog, by queue.
#[derive(Debug, Default)]
pub(crate) struct BacklogSampler {
    samples: Mutex<HashMap<String, (Instant, u64)>>,
}

impl BacklogSampler {
    fn fresh(&self, queue: &str) -> Option<u64> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples
            .get(queue)
            .filter(|(at, _)| at.elapsed() < SAMPLE_EVERY)
            .map(|(_, due)| *due)
    }

    /// The due backlog of `queue`: the last sample if younger than a second, else a new
    /// one. A failed read counts as no backlog (the policy's plain delay).
    pub(crate) async fn due(&self, storage: &dyn Storage, queue: &str) -> u64 {
        if let Some(due) = self.fresh(queue) {
            return due;
        }
        let params = QueueBacklogParams {
            queues: vec![queue.to_owned()],
            now: None,
        };
        let due = match storage.queue_backlog(&params).await {
            Ok(backlog) => backlog.first().map_or(0, |b| b.due),
            Err(e) => {
                warn!(queue, error = %e, "reading the queue backlog failed");
                return 0;
            }
        };
        self.samples
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(queue.to_owned(), (Instant::now(), due));
        due
    }
}
