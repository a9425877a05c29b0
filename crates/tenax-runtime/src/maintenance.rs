//! Background services every worker runs by default: the reaper and the pruner.
//!
//! Both are single conditional statements, so several workers running them at once is
//! harmless: a task is reaped or deleted by exactly one of them. The reaper judges
//! expiry on the database clock and watches that clock for steps (`ClockWatch`).
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use rand::Rng;
use tenax_storage::{OutboxPruneParams, SidePruneParams, Storage, TaskPruneParams, TaskReapParams};
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
///
/// Expiry is judged on the database clock, and the database clock can step: an NTP
/// correction, or a failover to a server whose clock is wrong. Each pass therefore
/// reads that clock first and checks it against its own monotonic clock
/// (`ClockWatch`); the pass then reaps at the time it read, or not at all while a
/// step forward is being waited out.
pub(crate) async fn reaper_loop(
    storage: Arc<dyn Storage>,
    interval: Duration,
    lease_ttl: Duration,
    stop: CancellationToken,
) {
    let mut watch = ClockWatch::new(lease_ttl);
    while jittered(interval, &stop).await {
        let before = Instant::now();
        let db = match storage.now().await {
            Ok(now) => now,
            Err(e) => {
                warn!(error = %e, "reaper pass failed");
                watch.unreachable();
                continue;
            }
        };
        let pass = watch.observe(Sample {
            before,
            after: Instant::now(),
            db,
        });
        let ReapPass::Reap {
            now,
            expires_beyond,
        } = pass
        else {
            continue;
        };
        match storage
            .task_reap_expired(&TaskReapParams {
                limit: REAP_BATCH,
                now: Some(now),
                expires_beyond,
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
            Err(e) => {
                warn!(error = %e, "reaper pass failed");
                watch.unreachable();
            }
        }
    }
}

/// A step of the database clock smaller than this (or a tenth of the lease TTL, if
/// that is less) goes unremarked. A healthy lease is renewed with most of its TTL
/// left, so a step this small reaps nothing early; a larger reading error only holds
/// the reaper for a TTL.
const CLOCK_STEP_TOLERANCE: Duration = Duration::from_secs(1);

/// A reading that took longer than this to come back may have waited out an outage:
/// while the server is down, a pass waits for a connection (the pool reconnects until
/// its acquire timeout) instead of failing. A heartbeat waits at most this long for its
/// own connection, so heartbeats may have failed meanwhile, and the reading is taken
/// like a failed pass followed by an answer.
const SLOW_READING: Duration = Duration::from_secs(1);

/// One reading of the database clock, between two readings of the local monotonic
/// clock (the query's round trip).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub before: Instant,
    pub after: Instant,
    pub db: DateTime<Utc>,
}

/// What a reaper pass may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReapPass {
    /// Reap nothing: the database clock may be ahead of leases that are still renewed.
    Hold,
    /// Reap the leases expired at `now` (the database time just read), and those
    /// expiring after `expires_beyond`: granted before the clock stepped back, and not
    /// renewed since.
    Reap {
        now: DateTime<Utc>,
        expires_beyond: Option<DateTime<Utc>>,
    },
}

/// The reaper's watch on the database clock.
///
/// Lease renewals use the database clock, so a step forward makes every lease look
/// expired although its worker renews it within a heartbeat. After a step forward (and
/// when the reaper starts, since a step may just have happened) the reaper waits one
/// lease TTL on its own monotonic clock before it reaps again: a lease still expired
/// after that has not been renewed for a whole TTL of real time, and its worker has
/// fenced itself (`WorkerConfig::fence_margin`).
///
/// After a step back, the leases granted before it expire the step later than they
/// should. Once a TTL has passed since the step, a lease expiring more than a TTL ahead
/// cannot have been renewed since (a renewal grants one TTL from now), so it is reaped
/// as expired.
///
/// An outage stops every heartbeat of the fleet at once, so the leases that expired
/// during it say nothing of their workers: once the database answers again after a
/// failed pass, or after a reading that took longer than [`SLOW_READING`] (a pass that
/// waited for its connection through the outage), the reaper waits one TTL the same
/// way, while the workers renew.
///
/// The TTL is this worker's: a fleet under one database shares it (a worker with a
/// longer one may be reaped after a step while it still runs).
#[derive(Debug)]
pub(crate) struct ClockWatch {
    lease_ttl: Duration,
    tolerance: Duration,
    last: Option<Sample>,
    hold_until: Option<Instant>,
    stepped_back: Option<StepBack>,
    /// A pass failed since the last reading: the database may have been down.
    unreached: bool,
}

/// A step back seen: when, and the database time just before it.
#[derive(Debug, Clone, Copy)]
struct StepBack {
    seen: Instant,
    db_before: DateTime<Utc>,
}

impl ClockWatch {
    pub(crate) fn new(lease_ttl: Duration) -> Self {
        Self {
            lease_ttl,
            tolerance: CLOCK_STEP_TOLERANCE.min(lease_ttl / 10),
            last: None,
            hold_until: None,
            stepped_back: None,
            unreached: false,
        }
    }

    /// A pass could not read the clock or reap: the next reading that succeeds holds
    /// the reaper for a TTL.
    pub(crate) fn unreachable(&mut self) {
        self.unreached = true;
    }

    /// Takes in this pass's reading and says what the pass may reap.
    pub(crate) fn observe(&mut self, sample: Sample) -> ReapPass {
        let ttl = chrono_duration(self.lease_ttl);
        let tolerance = chrono_duration(self.tolerance);
        match self.last {
            None => self.hold_until = Some(sample.after + self.lease_ttl),
            Some(last) => {
                // The database read its clock somewhere inside each round trip.
                let longest = chrono_duration(sample.after.saturating_duration_since(last.before));
                let shortest = chrono_duration(sample.before.saturating_duration_since(last.after));
                let moved = sample.db - last.db;
                if moved > longest + tolerance {
                    let step = moved - longest;
                    warn!(
                        step_ms = step.num_milliseconds(),
                        "the database clock stepped forward; no lease is reaped for a lease TTL"
                    );
                    self.hold_until = Some(sample.after + self.lease_ttl);
                } else if moved < shortest - tolerance {
                    let step = shortest - moved;
                    warn!(
                        step_ms = step.num_milliseconds(),
                        "the database clock stepped back; leases granted before it are reaped after a lease TTL"
                    );
                    let db_before = match self.stepped_back {
                        Some(earlier) => earlier.db_before.max(last.db),
                        None => last.db,
                    };
                    self.stepped_back = Some(StepBack {
                        seen: sample.after,
                        db_before,
                    });
                }
            }
        }
        let round_trip = sample.after.saturating_duration_since(sample.before);
        if std::mem::take(&mut self.unreached) {
            info!("the database answers again; no lease is reaped for a lease TTL");
            self.hold_until = Some(sample.after + self.lease_ttl);
        } else if round_trip > SLOW_READING {
            info!(
                round_trip_ms = round_trip.as_millis() as u64,
                "the database was slow to answer, and may have been down; no lease is reaped for a lease TTL"
            );
            self.hold_until = Some(sample.after + self.lease_ttl);
        }
        self.last = Some(sample);
        if self.hold_until.is_some_and(|until| sample.after < until) {
            return ReapPass::Hold;
        }
        self.hold_until = None;
        // Every lease granted before the step has expired by the clock once the clock
        // is back past the latest of them.
        if self
            .stepped_back
            .is_some_and(|back| sample.db > back.db_before + ttl + tolerance)
        {
            self.stepped_back = None;
        }
        let expires_beyond = self
            .stepped_back
            .filter(|back| sample.after.saturating_duration_since(back.seen) >= self.lease_ttl)
            .map(|_| sample.db + ttl + tolerance);
        ReapPass::Reap {
            now: sample.db,
            expires_beyond,
        }
    }
}

fn chrono_duration(d: Duration) -> chrono::TimeDelta {
    chrono::TimeDelta::from_std(d).unwrap_or(chrono::TimeDelta::MAX)
}

/// Delete finished tasks older than the retention, in bounded batches, then what they
/// leave behind (dependency rows, workflows, concurrency keys) and audit entries older
/// than the audit retention, likewise; then outbox rows settled, or left unsent, for
/// longer than the retention.
pub(crate) async fn pruner_loop(
    storage: Arc<dyn Storage>,
    config: WorkerConfig,
    stop: CancellationToken,
) {
    while jittered(config.pruner_interval, &stop).await {
        prune_tasks(storage.as_ref(), &config, &stop).await;
        prune_side_tables(storage.as_ref(), &config, &stop).await;
        prune_outbox(storage.as_ref(), &config).await;
    }
}

/// The outbox is pruned here, by every worker that prunes, so that a process running
/// no sender (a library worker without deliveries) still bounds it.
async fn prune_outbox(storage: &dyn Storage, config: &WorkerConfig) {
    let params = OutboxPruneParams {
        older_than: config.retention,
        sender_grace: tenax_storage::OUTBOX_SENDER_GRACE,
        now: None,
    };
    match storage.outbox_prune(&params).await {
        Ok(0) => {}
        Ok(n) => info!(rows = n, "pruned the outbox"),
        Err(e) => warn!(error = %e, "outbox pruner pass failed"),
    }
}

async fn prune_tasks(storage: &dyn Storage, config: &WorkerConfig, stop: &CancellationToken) {
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
                return;
            }
            Err(e) => {
                warn!(error = %e, "pruner pass failed");
                return;
            }
        }
    }
}

/// Sweep the side tables until no table fills a batch. Each call deletes at most
/// `prune_batch` rows per table, so a pass stays bounded however much was left.
async fn prune_side_tables(storage: &dyn Storage, config: &WorkerConfig, stop: &CancellationToken) {
    let params = SidePruneParams {
        audit_retention: config.audit_retention,
        limit: config.prune_batch,
        now: None,
    };
    while !stop.is_cancelled() {
        match storage.side_prune(&params).await {
            Ok(pruned) => {
                if pruned.total() > 0 {
                    info!(
                        keys = pruned.keys,
                        dependencies = pruned.deps,
                        workflows = pruned.workflows,
                        audit = pruned.audit,
                        "pruned side tables"
                    );
                }
                if !pruned.more(config.prune_batch) {
                    return;
                }
            }
            Err(e) => {
                warn!(error = %e, "side-table pruner pass failed");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    /// Readings of the database clock at local times counted from `start`, each with a
    /// 10 ms round trip.
    struct Clocks {
        start: Instant,
        db_start: DateTime<Utc>,
    }

    impl Clocks {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                db_start: DateTime::parse_from_rfc3339("2026-06-01T12:00:00Z")
                    .map(|t| t.with_timezone(&Utc))
                    .unwrap_or_default(),
            }
        }

        /// At `local` seconds, the database clock reading `local + offset` seconds.
        fn at(&self, local: f64, offset: f64) -> Sample {
            let before = self.start + Duration::from_secs_f64(local);
            Sample {
                before,
                after: before + Duration::from_millis(10),
                db: self.db_at(local + offset),
            }
        }

        fn db_at(&self, secs: f64) -> DateTime<Utc> {
            self.db_start + chrono::TimeDelta::milliseconds((secs * 1000.0) as i64)
        }
    }

    fn reaps_at(pass: ReapPass) -> Option<DateTime<Utc>> {
        match pass {
            ReapPass::Reap { now, .. } => Some(now),
            ReapPass::Hold => None,
        }
    }

    #[test]
    fn a_new_reaper_waits_one_ttl_then_reaps_at_the_time_it_read() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        for local in [0.0, 5.0, 10.0, 25.0] {
            assert_eq!(watch.observe(clocks.at(local, 0.0)), ReapPass::Hold);
        }
        assert_eq!(
            watch.observe(clocks.at(30.0, 0.0)),
            ReapPass::Reap {
                now: clocks.db_at(30.0),
                expires_beyond: None,
            }
        );
    }

    #[test]
    fn a_step_forward_holds_the_reaper_for_one_ttl_from_when_it_is_seen() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        for local in [0.0, 31.0, 36.0] {
            watch.observe(clocks.at(local, 0.0));
        }
        assert!(reaps_at(watch.observe(clocks.at(41.0, 0.0))).is_some());
        // The clock jumps an hour ahead between two passes.
        assert_eq!(watch.observe(clocks.at(46.0, 3600.0)), ReapPass::Hold);
        assert_eq!(watch.observe(clocks.at(75.0, 3600.0)), ReapPass::Hold);
        assert_eq!(
            reaps_at(watch.observe(clocks.at(76.1, 3600.0))),
            Some(clocks.db_at(3676.1))
        );
    }

    #[test]
    fn after_a_failed_pass_the_reaper_waits_one_ttl_once_the_database_answers() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        watch.observe(clocks.at(0.0, 0.0));
        assert!(reaps_at(watch.observe(clocks.at(31.0, 0.0))).is_some());
        watch.unreachable();
        assert_eq!(watch.observe(clocks.at(38.0, 0.0)), ReapPass::Hold);
        assert_eq!(watch.observe(clocks.at(67.0, 0.0)), ReapPass::Hold);
        assert!(reaps_at(watch.observe(clocks.at(68.1, 0.0))).is_some());
    }

    #[test]
    fn drift_within_the_tolerance_and_slow_round_trips_hold_nothing() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        watch.observe(clocks.at(0.0, 0.0));
        watch.observe(clocks.at(31.0, 0.0));
        // 0.8 s ahead is under the tolerance.
        assert!(reaps_at(watch.observe(clocks.at(36.0, 0.8))).is_some());
        // A reading that took 0.9 s, read at its end: no step.
        let slow = Sample {
            before: clocks.start + Duration::from_secs(41),
            after: clocks.start + Duration::from_millis(41_900),
            db: clocks.db_at(41.9),
        };
        assert!(reaps_at(watch.observe(slow)).is_some());
        assert!(reaps_at(watch.observe(clocks.at(49.0, 0.0))).is_some());
    }

    /// A pass that waits for its connection while the database is down is answered once
    /// it is back: the heartbeats were stopped as long, so the leases that expired
    /// meanwhile are left to their workers' renewals for a TTL.
    #[test]
    fn a_reading_that_waited_out_an_outage_holds_the_reaper_for_one_ttl() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        watch.observe(clocks.at(0.0, 0.0));
        assert!(reaps_at(watch.observe(clocks.at(31.0, 0.0))).is_some());
        let waited = Sample {
            before: clocks.start + Duration::from_secs(36),
            after: clocks.start + Duration::from_millis(38_600),
            db: clocks.db_at(38.6),
        };
        assert_eq!(watch.observe(waited), ReapPass::Hold);
        assert_eq!(watch.observe(clocks.at(68.0, 0.0)), ReapPass::Hold);
        assert!(reaps_at(watch.observe(clocks.at(68.7, 0.0))).is_some());
    }

    #[test]
    fn after_a_step_back_leases_from_before_it_are_named_once_a_ttl_has_passed() {
        let clocks = Clocks::new();
        let mut watch = ClockWatch::new(TTL);
        watch.observe(clocks.at(0.0, 0.0));
        watch.observe(clocks.at(31.0, 0.0));
        // The clock steps an hour back between 31 s and 36 s.
        let beyond = |pass| match pass {
            ReapPass::Reap { expires_beyond, .. } => expires_beyond,
            ReapPass::Hold => panic!("a step back holds nothing"),
        };
        assert_eq!(beyond(watch.observe(clocks.at(36.0, -3600.0))), None);
        assert_eq!(beyond(watch.observe(clocks.at(60.0, -3600.0))), None);
        // A TTL after the step was seen: a lease expiring beyond one TTL (and the
        // tolerance) from now was granted before the step.
        assert_eq!(
            beyond(watch.observe(clocks.at(66.1, -3600.0))),
            Some(clocks.db_at(66.1 - 3600.0 + 31.0))
        );
        // Once the clock is back past every lease granted before the step, none remain.
        assert_eq!(
            beyond(watch.observe(clocks.at(3600.0 + 31.0 + 32.0, -3600.0))),
            None
        );
    }
}
