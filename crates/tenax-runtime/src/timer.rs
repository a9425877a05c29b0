//! The worker's local timer for the next delayed task it could claim.
//!
//! After a claim that left slots free, the claim loop asks the database for the
//! earliest future run time among the tasks it could claim
//! ([`Storage::task_next_run_at`]) and sleeps until then, or the poll interval if that
//! is sooner. The wait is computed on the database's clock (`run_at - now` from the same
//! read), so a skewed local clock does not move it. A wake-up (an enqueue in this
//! process, or a PostgreSQL notification from another) ends the sleep and re-arms the
//! timer: a task enqueued with an earlier run time is not missed. A task that fell due
//! between the last claim and this read is reported due, so the loop claims again at
//! once instead of sleeping past it.
use std::time::Duration;

use tenax_storage::{Storage, TaskNextRunParams};
use tokio::time::Instant;
use tracing::warn;

use crate::config::WorkerConfig;

/// Slack added to the database's wait, so the claim after the timer finds the task due
/// (run times are stored in milliseconds or microseconds).
const SLACK: Duration = Duration::from_millis(1);

/// How long the claim loop may sleep: until the next task it could claim is due, at
/// most the poll interval. `claimed` is when the loop's last claim was sent: a task
/// that fell due since then is reported due, and the loop claims again at once.
pub(crate) async fn next_due_wait(
    storage: &dyn Storage,
    config: &WorkerConfig,
    queues: &[String],
    commands: &[(String, u32)],
    claimed: Instant,
) -> Duration {
    let params = TaskNextRunParams {
        queues: queues.to_vec(),
        commands: commands.to_vec(),
        since: claimed.elapsed() + SLACK,
        now: None,
    };
    match storage.task_next_run_at(&params).await {
        Ok(Some(next)) => wait_for(next.run_at - next.now, config.poll_interval),
        Ok(None) => config.poll_interval,
        Err(e) => {
            warn!(error = %e, "reading the next run time failed; polling");
            config.poll_interval
        }
    }
}

/// The sleep for a task due in `until` (database clock), at most `poll`.
fn wait_for(until: chrono::TimeDelta, poll: Duration) -> Duration {
    let until = until.to_std().unwrap_or(Duration::ZERO);
    (until + SLACK).min(poll)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_never_sleeps_past_the_poll_or_before_the_run_time() {
        let poll = Duration::from_secs(1);
        let ms = chrono::TimeDelta::milliseconds;
        assert_eq!(wait_for(ms(250), poll), Duration::from_millis(251));
        assert_eq!(wait_for(ms(60_000), poll), poll);
        // Already due (a racing claim took it, or clocks rounded): claim again at once.
        assert_eq!(wait_for(ms(-5), poll), SLACK);
    }
}
