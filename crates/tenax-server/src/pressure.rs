//! Back-pressure: the pending count of each queue, read at most about once a second.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a queue's pending count is reused before it is read again.
pub(crate) const PENDING_TTL: Duration = Duration::from_secs(1);

/// Waiting counts by queue, with when each was read. A count is an estimate between
/// reads (tasks enqueued by this process are added to it), which is what a limit meant
/// to stop unbounded growth needs.
#[derive(Debug, Default)]
pub(crate) struct PendingCache {
    counts: Mutex<HashMap<String, (Instant, u64)>>,
}

impl PendingCache {
    /// The cached count of a queue, if fresh.
    pub(crate) fn get(&self, queue: &str) -> Option<u64> {
        let counts = self.counts.lock().ok()?;
        counts
            .get(queue)
            .filter(|(at, _)| at.elapsed() < PENDING_TTL)
            .map(|(_, n)| *n)
    }

    /// Store fresh counts.
    pub(crate) fn put(&self, fresh: impl IntoIterator<Item = (String, u64)>) {
        if let Ok(mut counts) = self.counts.lock() {
            let now = Instant::now();
            for (queue, n) in fresh {
                counts.insert(queue, (now, n));
            }
        }
    }

    /// One more task was enqueued into a queue.
    pub(crate) fn bump(&self, queue: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            if let Some((_, n)) = counts.get_mut(queue) {
                *n += 1;
            }
        }
    }
}
