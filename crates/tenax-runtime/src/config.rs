//! Worker configuration: every default is a `pub const`, every value is validated at
//! construction.
use std::time::Duration;

use tenax_core::QueueName;

/// A configuration the worker cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid worker configuration: {0}")]
pub struct ConfigError(pub String);

/// How a worker claims, leases and maintains tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Queues to claim from. Defaults to `["default"]`.
    pub queues: Vec<String>,
    /// Tasks run at once. Defaults to [`WorkerConfig::CONCURRENCY_DEFAULT`] (10).
    pub concurrency: u32,
    /// Most tasks claimed in one statement. Defaults to
    /// [`WorkerConfig::CLAIM_BATCH_DEFAULT`] (100). A claim takes at most the free slots
    /// plus the room left in the prefetch buffer.
    pub claim_batch: u32,
    /// Claimed tasks held ready beyond the running ones, so that a freed slot starts its
    /// next task without a round trip to the database. Buffered tasks are leased,
    /// renewed and counted by every limit as running; a graceful stop hands them back
    /// at once, with their attempts refunded. `None` (the default) sizes the buffer by
    /// the handlers' pace: it starts at `concurrency` (at most `claim_batch`) and
    /// doubles, up to `claim_batch`, each time the handlers empty it before a full
    /// claim returns; it shrinks back when they no longer do, and returns to
    /// `concurrency` when a claim comes back short. `Some(n)` holds it at `n`;
    /// `Some(0)` turns the buffer off. A task enqueued while the buffer is full waits,
    /// at most, for the buffered tasks to start (see [`WorkerConfig::prefetch_size`]).
    pub prefetch: Option<u32>,
    /// Most successful outcomes written in one completion batch (one transaction).
    /// Also the most outcomes a worker holds decided but not yet committed: a handler
    /// that returns frees its slot at once while fewer are waiting, and keeps it until
    /// one commits otherwise. Defaults to [`WorkerConfig::COMPLETE_BATCH_DEFAULT`]
    /// (100); at most [`tenax_storage::COMPLETE_MANY_MAX`].
    pub complete_batch: u32,
    /// How long a finished handler's success may wait for others to share its
    /// completion batch; the batch is written sooner when it is full or when every
    /// running attempt has joined it. While some tasks run, it also bounds how long
    /// the claim loop waits for half the slots (or a claim batch) to free before it
    /// claims; an idle worker claims at once. Zero turns both off: each success is
    /// written by its own transaction and a freed slot is claimed for at once. Either
    /// way a task's outcome is reported (hooks' metrics, the written result) only after
    /// the transaction holding its completion committed. Defaults to
    /// [`WorkerConfig::BATCH_LINGER_DEFAULT`] (2 ms).
    pub batch_linger: Duration,
    /// Wait between claims when idle (a wake-up may end it sooner). Defaults to
    /// [`WorkerConfig::POLL_INTERVAL_DEFAULT`] (1 s).
    pub poll_interval: Duration,
    /// Lease length granted at each claim and heartbeat. Defaults to
    /// [`WorkerConfig::LEASE_TTL_DEFAULT`] (30 s).
    pub lease_ttl: Duration,
    /// Time between heartbeats. Defaults to [`WorkerConfig::HEARTBEAT_DEFAULT`] (10 s).
    pub heartbeat_interval: Duration,
    /// A handler is stopped when its lease has not been renewed by its expiry minus
    /// this margin (self-fencing), measured on the local monotonic clock. Defaults to
    /// [`WorkerConfig::FENCE_MARGIN_DEFAULT`] (5 s).
    pub fence_margin: Duration,
    /// On stop, how long running tasks may finish before they are cancelled and handed
    /// back. Defaults to [`WorkerConfig::SHUTDOWN_GRACE_DEFAULT`] (15 s).
    pub shutdown_grace: Duration,
    /// Run the reaper (expired leases) in this worker. Defaults to `true`.
    pub reaper: bool,
    /// Time between reaper passes. Defaults to [`WorkerConfig::REAPER_INTERVAL_DEFAULT`]
    /// (5 s).
    pub reaper_interval: Duration,
    /// Run the pruner (finished tasks) in this worker. Defaults to `true`.
    pub pruner: bool,
    /// Time between pruner passes. Defaults to [`WorkerConfig::PRUNER_INTERVAL_DEFAULT`]
    /// (1 min).
    pub pruner_interval: Duration,
    /// Finished tasks are deleted after this. Defaults to
    /// [`WorkerConfig::RETENTION_DEFAULT`] (7 days).
    pub retention: Duration,
    /// Most tasks deleted per pruner statement, and most rows per side table (dependency
    /// rows, workflows, concurrency keys, audit entries) per sweep. Defaults to
    /// [`WorkerConfig::PRUNE_BATCH_DEFAULT`] (1000).
    pub prune_batch: u32,
    /// Audit entries are deleted by the pruner after this. Defaults to
    /// [`WorkerConfig::AUDIT_RETENTION_DEFAULT`] (90 days).
    pub audit_retention: Duration,
    /// Fire the due ticks of periodic schedules in this worker. Defaults to `true`:
    /// the database decides which node fires a tick, so every worker can. The
    /// worker's own schedules are declared at start either way.
    pub scheduler: bool,
    /// Time between scheduler passes; a tick fires at most about this late. Defaults
    /// to [`WorkerConfig::SCHEDULER_INTERVAL_DEFAULT`] (1 s).
    pub scheduler_interval: Duration,
    /// How late a tick of a schedule that skips missed ticks
    /// ([`MissedTicks::Skip`](tenax_core::MissedTicks::Skip), the default) may be and
    /// still fire: after an outage or a deploy longer than this, the ticks it missed
    /// are skipped. At least [`WorkerConfig::scheduler_interval`]. Defaults to
    /// [`MissedTicks::GRACE`](tenax_core::MissedTicks::GRACE) (1 minute).
    pub missed_tick_grace: Duration,
    /// Queues of [`WorkerConfig::queues`] claimed only in quiet periods. Defaults to
    /// none.
    pub background: Vec<BackgroundQueue>,
    /// Secret payload fields per command type. Before an outcome is written, the
    /// result's secret fields and every literal copy of a secret value in the result or
    /// the error are replaced by `"***"`, so that no event, callback, alert or answer
    /// carries them (see [`tenax_core::secrets`]). Defaults to none.
    pub secrets: tenax_core::Secrets,
}

/// A queue claimed only while the worker's other queues are quiet, or within off-peak
/// hours, or once its oldest due task has waited [`BackgroundQueue::max_deferral`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackgroundQueue {
    /// The queue (one of [`WorkerConfig::queues`]).
    pub queue: String,
    /// Claimed while the due backlog of the worker's other queues is under this.
    pub threshold: u64,
    /// Also claimed within these hours, whatever the backlog.
    pub off_peak: Option<OffPeak>,
    /// Claimed anyway once its oldest due task has waited this long (at least 1 s).
    pub max_deferral: Duration,
}

/// Daily hours in a time zone; `end` before `start` spans midnight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffPeak {
    /// First minute of the window (local time).
    pub start: chrono::NaiveTime,
    /// End of the window, excluded (local time).
    pub end: chrono::NaiveTime,
    /// The time zone the hours are in (daylight saving time applies).
    pub time_zone: chrono_tz::Tz,
}

impl WorkerConfig {
    /// Default [`WorkerConfig::concurrency`].
    pub const CONCURRENCY_DEFAULT: u32 = 10;
    /// Default [`WorkerConfig::claim_batch`].
    pub const CLAIM_BATCH_DEFAULT: u32 = 100;
    /// Default [`WorkerConfig::complete_batch`].
    pub const COMPLETE_BATCH_DEFAULT: u32 = 100;
    /// Default [`WorkerConfig::batch_linger`].
    pub const BATCH_LINGER_DEFAULT: Duration = Duration::from_millis(2);
    /// Default [`WorkerConfig::poll_interval`].
    pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
    /// Default [`WorkerConfig::lease_ttl`].
    pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(30);
    /// Default [`WorkerConfig::heartbeat_interval`].
    pub const HEARTBEAT_DEFAULT: Duration = Duration::from_secs(10);
    /// Default [`WorkerConfig::fence_margin`].
    pub const FENCE_MARGIN_DEFAULT: Duration = Duration::from_secs(5);
    /// Default [`WorkerConfig::shutdown_grace`].
    pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(15);
    /// Default [`WorkerConfig::reaper_interval`].
    pub const REAPER_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
    /// Default [`WorkerConfig::pruner_interval`].
    pub const PRUNER_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
    /// Default [`WorkerConfig::retention`].
    pub const RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
    /// Default [`WorkerConfig::prune_batch`].
    pub const PRUNE_BATCH_DEFAULT: u32 = 1000;
    /// Default [`WorkerConfig::audit_retention`].
    pub const AUDIT_RETENTION_DEFAULT: Duration = Duration::from_secs(90 * 24 * 3600);
    /// Default [`WorkerConfig::scheduler_interval`].
    pub const SCHEDULER_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

    /// Check the configuration; called by [`Worker::new`](crate::Worker::new).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |m: String| Err(ConfigError(m));
        if self.queues.is_empty() {
            return err("at least one queue is needed".into());
        }
        for queue in &self.queues {
            QueueName::new(queue.clone()).map_err(|e| ConfigError(e.to_string()))?;
        }
        if self.concurrency == 0 || self.claim_batch == 0 || self.prune_batch == 0 {
            return err("concurrency, claim batch and prune batch must be at least 1".into());
        }
        if self.complete_batch == 0
            || self.complete_batch as usize > tenax_storage::COMPLETE_MANY_MAX
        {
            return err(format!(
                "complete batch must be between 1 and {}",
                tenax_storage::COMPLETE_MANY_MAX
            ));
        }
        if let Some(prefetch) = self.prefetch {
            if prefetch > self.claim_batch {
                return err(format!(
                    "prefetch ({prefetch}) must be at most the claim batch ({})",
                    self.claim_batch
                ));
            }
        }
        if self.batch_linger >= self.fence_margin {
            return err(format!(
                "batch linger ({:?}) must be shorter than the fence margin ({:?})",
                self.batch_linger, self.fence_margin
            ));
        }
        if self.poll_interval.is_zero()
            || self.reaper_interval.is_zero()
            || self.pruner_interval.is_zero()
            || self.scheduler_interval.is_zero()
        {
            return err("poll, reaper, pruner and scheduler intervals must be positive".into());
        }
        if self.missed_tick_grace < self.scheduler_interval {
            return err(format!(
                "missed tick grace ({:?}) must be at least the scheduler interval ({:?}): a tick found one pass late would be skipped",
                self.missed_tick_grace, self.scheduler_interval
            ));
        }
        if self.fence_margin >= self.lease_ttl {
            return err(format!(
                "fence margin ({:?}) must be shorter than the lease TTL ({:?})",
                self.fence_margin, self.lease_ttl
            ));
        }
        for rule in &self.background {
            if !self.queues.contains(&rule.queue) {
                return err(format!(
                    "background queue {:?} is not one of the worker's queues",
                    rule.queue
                ));
            }
            if self
                .background
                .iter()
                .filter(|b| b.queue == rule.queue)
                .count()
                > 1
            {
                return err(format!("background queue {:?} is listed twice", rule.queue));
            }
            if rule.max_deferral < crate::background::MIN_DEFERRAL {
                return err(format!(
                    "the maximum deferral of background queue {:?} must be at least 1 s",
                    rule.queue
                ));
            }
            if rule.off_peak.as_ref().is_some_and(|h| h.start == h.end) {
                return err(format!(
                    "the off-peak hours of background queue {:?} are empty (start = end)",
                    rule.queue
                ));
            }
        }
        if self.heartbeat_interval.is_zero()
            || self.heartbeat_interval >= self.lease_ttl - self.fence_margin
        {
            return err(format!(
                "heartbeat interval ({:?}) must be positive and shorter than lease TTL minus fence margin ({:?})",
                self.heartbeat_interval,
                self.lease_ttl - self.fence_margin
            ));
        }
        Ok(())
    }

    /// The most claimed tasks the worker buffers beyond its running ones:
    /// [`WorkerConfig::prefetch`], or by default `claim_batch`.
    ///
    /// The buffer is refilled when half empty, by one claim of the free slots plus its
    /// room, so a worker holds at most `concurrency + prefetch_size()` tasks. Priority
    /// still holds across the buffer's refills: a task of priority 9 enqueued just after
    /// a refill starts once the buffered tasks ahead of it have started. By default the
    /// buffer stays at `concurrency` (one round of the running handlers) while handlers
    /// run longer than about two claim round trips (a claim is sent when the buffer is
    /// down to half), and grows only while they empty it before a full claim returns:
    /// it then holds what they start in about two claims' time. Either way the wait is
    /// at most `prefetch_size() / concurrency` rounds of the running handlers, plus one
    /// claim; that worst case is a backlog whose handlers turn slow right after the
    /// buffer grew, and the buffer then halves at each claim back to `concurrency`.
    pub fn prefetch_size(&self) -> u32 {
        self.prefetch
            .unwrap_or(self.claim_batch)
            .min(self.claim_batch)
    }

    /// The buffer's size before the handlers' pace is known: [`WorkerConfig::prefetch`],
    /// or by default `concurrency`, at most `claim_batch`. The adaptive buffer never
    /// shrinks below it.
    pub fn prefetch_floor(&self) -> u32 {
        self.prefetch
            .unwrap_or(self.concurrency)
            .min(self.claim_batch)
    }

    /// Lease timings scaled down for tests and demos: TTL `ttl`, heartbeat TTL/4,
    /// fence margin TTL/4, poll 50 ms, reaper TTL/4.
    pub fn fast(ttl: Duration) -> Self {
        Self {
            lease_ttl: ttl,
            heartbeat_interval: ttl / 4,
            fence_margin: ttl / 4,
            poll_interval: Duration::from_millis(50),
            reaper_interval: ttl / 4,
            ..Self::default()
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            queues: vec![QueueName::DEFAULT.to_owned()],
            concurrency: Self::CONCURRENCY_DEFAULT,
            claim_batch: Self::CLAIM_BATCH_DEFAULT,
            prefetch: None,
            complete_batch: Self::COMPLETE_BATCH_DEFAULT,
            batch_linger: Self::BATCH_LINGER_DEFAULT,
            poll_interval: Self::POLL_INTERVAL_DEFAULT,
            lease_ttl: Self::LEASE_TTL_DEFAULT,
            heartbeat_interval: Self::HEARTBEAT_DEFAULT,
            fence_margin: Self::FENCE_MARGIN_DEFAULT,
            shutdown_grace: Self::SHUTDOWN_GRACE_DEFAULT,
            reaper: true,
            reaper_interval: Self::REAPER_INTERVAL_DEFAULT,
            pruner: true,
            pruner_interval: Self::PRUNER_INTERVAL_DEFAULT,
            retention: Self::RETENTION_DEFAULT,
            prune_batch: Self::PRUNE_BATCH_DEFAULT,
            audit_retention: Self::AUDIT_RETENTION_DEFAULT,
            background: Vec::new(),
            scheduler: true,
            scheduler_interval: Self::SCHEDULER_INTERVAL_DEFAULT,
            missed_tick_grace: tenax_core::MissedTicks::GRACE,
            secrets: tenax_core::Secrets::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_starts_at_the_concurrency_and_may_grow_to_the_claim_batch() {
        let default = WorkerConfig::default();
        assert_eq!(
            (default.prefetch_floor(), default.prefetch_size()),
            (10, 100)
        );
        let wide = WorkerConfig {
            concurrency: 500,
            ..Default::default()
        };
        assert_eq!((wide.prefetch_floor(), wide.prefetch_size()), (100, 100));
        let fixed = WorkerConfig {
            prefetch: Some(4),
            ..Default::default()
        };
        assert_eq!((fixed.prefetch_floor(), fixed.prefetch_size()), (4, 4));
        let off = WorkerConfig {
            prefetch: Some(0),
            ..Default::default()
        };
        assert_eq!((off.prefetch_floor(), off.prefetch_size()), (0, 0));
    }

    #[test]
    fn defaults_are_valid_and_bad_values_are_refused() {
        WorkerConfig::default().validate().unwrap();
        WorkerConfig::fast(Duration::from_secs(2))
            .validate()
            .unwrap();
        let bad = [
            WorkerConfig {
                concurrency: 0,
                ..Default::default()
            },
            WorkerConfig {
                prefetch: Some(101),
                ..Default::default()
            },
            WorkerConfig {
                queues: vec![],
                ..Default::default()
            },
            WorkerConfig {
                complete_batch: 0,
                ..Default::default()
            },
            WorkerConfig {
                batch_linger: Duration::from_secs(5),
                ..Default::default()
            },
            WorkerConfig {
                queues: vec!["a b".into()],
                ..Default::default()
            },
            WorkerConfig {
                fence_margin: Duration::from_secs(30),
                ..Default::default()
            },
            WorkerConfig {
                heartbeat_interval: Duration::from_secs(25),
                ..Default::default()
            },
            WorkerConfig {
                background: vec![BackgroundQueue {
                    queue: "elsewhere".into(),
                    threshold: 10,
                    off_peak: None,
                    max_deferral: Duration::from_secs(60),
                }],
                ..Default::default()
            },
            WorkerConfig {
                background: vec![BackgroundQueue {
                    queue: "default".into(),
                    threshold: 10,
                    off_peak: None,
                    max_deferral: Duration::ZERO,
                }],
                ..Default::default()
            },
            WorkerConfig {
                scheduler_interval: Duration::ZERO,
                ..Default::default()
            },
            WorkerConfig {
                scheduler_interval: Duration::from_secs(5),
                missed_tick_grace: Duration::from_secs(4),
                ..Default::default()
            },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
