//! Background queues: work that runs in quiet periods.
//!
//! A queue of a worker's set can be marked background ([`BackgroundQueue`]). It is
//! claimed only while one of these holds:
//!
//! - the due backlog of the worker's other (foreground) queues is under its
//!   threshold;
//! - the time, in the configured time zone, is within its off-peak hours;
//! - its oldest due task has waited longer than its maximum deferral (it runs anyway).
//!
//! The decision is sampled at most once per second ([`SAMPLE_EVERY`]) from the
//! database: the due backlog of every queue of the set and the database's now.
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, NaiveTime, Utc};
use tenax_storage::{QueueBacklog, QueueBacklogParams, Storage};
use tokio::time::Instant;
use tracing::warn;

use crate::backlog::SAMPLE_EVERY;
use crate::config::{BackgroundQueue, OffPeak, WorkerConfig};

impl OffPeak {
    /// Whether `now` falls in these hours, in their time zone. A window whose end is
    /// before its start runs over midnight (22:00–06:00).
    pub fn contains(&self, now: DateTime<Utc>) -> bool {
        let local: NaiveTime = now.with_timezone(&self.time_zone).time();
        if self.start <= self.end {
            self.start <= local && local < self.end
        } else {
            local >= self.start || local < self.end
        }
    }
}

/// The queues to claim from now: every foreground queue, and each background queue
/// whose condition holds (see the [module docs](self)).
pub(crate) fn claimable_queues(
    config: &WorkerConfig,
    backlog: &[QueueBacklog],
    now: DateTime<Utc>,
) -> Vec<String> {
    let background = |queue: &str| config.background.iter().find(|b| b.queue == queue);
    let foreground_due: u64 = backlog
        .iter()
        .filter(|b| config.queues.contains(&b.queue) && background(&b.queue).is_none())
        .map(|b| b.due)
        .fold(0, u64::saturating_add);
    config
        .queues
        .iter()
        .filter(|queue| match background(queue) {
            None => true,
            Some(rule) => {
                let oldest = backlog
                    .iter()
                    .find(|b| &b.queue == *queue)
                    .and_then(|b| b.oldest_due_at);
                background_runs(rule, foreground_due, oldest, now)
            }
        })
        .cloned()
        .collect()
}

fn background_runs(
    rule: &BackgroundQueue,
    foreground_due: u64,
    oldest_due_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    let overdue = oldest_due_at.is_some_and(|oldest| {
        (now - oldest)
            .to_std()
            .is_ok_and(|waited| waited >= rule.max_deferral)
    });
    foreground_due < rule.threshold
        || rule
            .off_peak
            .as_ref()
            .is_some_and(|hours| hours.contains(now))
        || overdue
}

/// The last decision, reused for [`SAMPLE_EVERY`].
#[derive(Debug, Default)]
pub(crate) struct BackgroundGate {
    last: Mutex<Option<(Instant, Vec<String>)>>,
}

impl BackgroundGate {
    /// The queues to claim from now. Without background queues, the configured set;
    /// if sampling fails, the foreground queues only.
    pub(crate) async fn queues(&self, storage: &dyn Storage, config: &WorkerConfig) -> Vec<String> {
        if config.background.is_empty() {
            return config.queues.clone();
        }
        if let Some((at, queues)) = &*self.last.lock().unwrap_or_else(|e| e.into_inner()) {
            if at.elapsed() < SAMPLE_EVERY {
                return queues.clone();
            }
        }
        let params = QueueBacklogParams {
            queues: config.queues.clone(),
            now: None,
        };
        let sampled = async {
            let now = storage.now().await?;
            let backlog = storage.queue_backlog(&params).await?;
            Ok::<_, tenax_storage::StorageError>(claimable_queues(config, &backlog, now))
        };
        let queues = match sampled.await {
            Ok(queues) => queues,
            Err(e) => {
                warn!(error = %e, "sampling queue backlogs failed; background queues wait");
                let foreground = config
                    .queues
                    .iter()
                    .filter(|q| config.background.iter().all(|b| &b.queue != *q))
                    .cloned()
                    .collect();
                return foreground;
            }
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), queues.clone()));
        queues
    }
}

/// The longest a background queue may be deferred, at least.
pub(crate) const MIN_DEFERRAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 15, h, m, 0).unwrap()
    }

    fn backlog(queue: &str, due: u64, oldest: Option<DateTime<Utc>>) -> QueueBacklog {
        QueueBacklog {
            queue: queue.into(),
            due,
            oldest_due_at: oldest,
        }
    }

    fn config(off_peak: Option<OffPeak>) -> WorkerConfig {
        WorkerConfig {
            queues: vec!["default".into(), "reports".into(), "bulk".into()],
            background: vec![BackgroundQueue {
                queue: "bulk".into(),
                threshold: 100,
                off_peak,
                max_deferral: Duration::from_secs(3600),
            }],
            ..WorkerConfig::default()
        }
    }

    #[test]
    fn a_background_queue_waits_while_the_others_are_busy() {
        let config = config(None);
        let now = at(12, 0);
        let quiet = [
            backlog("default", 60, Some(now)),
            backlog("reports", 39, Some(now)),
            backlog("bulk", 5_000, Some(now)),
        ];
        assert_eq!(
            claimable_queues(&config, &quiet, now),
            ["default", "reports", "bulk"],
            "99 due elsewhere: under the threshold of 100"
        );
        let busy = [
            backlog("default", 60, Some(now)),
            backlog("reports", 40, Some(now)),
            backlog("bulk", 5_000, Some(now)),
        ];
        assert_eq!(
            claimable_queues(&config, &busy, now),
            ["default", "reports"]
        );
    }

    #[test]
    fn a_deferred_queue_runs_anyway_after_its_maximum_deferral() {
        let config = config(None);
        let now = at(12, 0);
        let waited = |minutes: i64| {
            [
                backlog("default", 1_000, Some(now)),
                backlog("bulk", 1, Some(now - chrono::TimeDelta::minutes(minutes))),
            ]
        };
        assert_eq!(
            claimable_queues(&config, &waited(59), now),
            ["default", "reports"]
        );
        assert_eq!(
            claimable_queues(&config, &waited(60), now),
            ["default", "reports", "bulk"]
        );
    }

    #[test]
    fn off_peak_hours_follow_the_time_zone_and_may_span_midnight() {
        // 22:00-06:00 in Paris: UTC+1 in January.
        let off_peak = OffPeak {
            start: NaiveTime::from_hms_opt(22, 0, 0).unwrap(),
            end: NaiveTime::from_hms_opt(6, 0, 0).unwrap(),
            time_zone: chrono_tz::Europe::Paris,
        };
        assert!(off_peak.contains(at(21, 0)), "22:00 in Paris");
        assert!(off_peak.contains(at(2, 0)), "03:00 in Paris");
        assert!(!off_peak.contains(at(5, 0)), "06:00 in Paris");
        assert!(!off_peak.contains(at(20, 59)), "21:59 in Paris");
        let config = config(Some(off_peak));
        let busy = |now| {
            [
                backlog("default", 1_000, Some(now)),
                backlog("bulk", 1, Some(now)),
            ]
        };
        assert_eq!(
            claimable_queues(&config, &busy(at(23, 0)), at(23, 0)),
            ["default", "reports", "bulk"]
        );
        assert_eq!(
            claimable_queues(&config, &busy(at(12, 0)), at(12, 0)),
            ["default", "reports"]
        );
        // Same window in summer (UTC+2): 21:30 UTC is 23:30 in Paris.
        let july = Utc.with_ymd_and_hms(2026, 7, 15, 21, 30, 0).unwrap();
        assert!(config.background[0]
            .off_peak
            .as_ref()
            .unwrap()
            .contains(july));
        let july_evening = Utc.with_ymd_and_hms(2026, 7, 15, 19, 30, 0).unwrap();
        assert!(!config.background[0]
            .off_peak
            .as_ref()
            .unwrap()
            .contains(july_evening));
    }
}
