//! Periodic schedules in the runtime: the [`Client`]'s schedule methods and the
//! scheduler every worker runs by default.
//!
//! The scheduler declares the worker's schedules (an upsert: a restart changes nothing,
//! a changed definition is updated, a paused schedule stays paused), then, every
//! [`WorkerConfig::scheduler_interval`](crate::WorkerConfig::scheduler_interval), asks
//! the storage to fire the due ticks. The storage decides which node fires a tick, in
//! one transaction per call, so every worker can run the scheduler: no leader is
//! elected and none is needed.
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{Schedule, ScheduleDef};
use tenax_storage::{
    FiredTick, ScheduleFireParams, SchedulePauseParams, ScheduleRecord, ScheduleUpsertParams,
    ScheduleUpserted, Storage,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::error::Error;
use crate::maintenance::jittered;
use crate::{Client, Worker};

/// Most schedules fired per storage call.
pub const FIRE_BATCH: u32 = 100;

impl Client {
    /// Store a schedule, or update the one of the same name (see
    /// [`Storage::schedule_upsert`]). An invalid schedule is refused with the reason and
    /// changes nothing.
    pub async fn upsert_schedule(
        &self,
        schedule: Schedule,
    ) -> Result<(ScheduleRecord, ScheduleUpserted), Error> {
        let def = schedule.build()?;
        Ok(self
            .storage()
            .schedule_upsert(&ScheduleUpsertParams { def, now: None })
            .await?)
    }

    /// Every schedule, by name, with its next fire time.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRecord>, Error> {
        Ok(self.storage().schedule_list().await?)
    }

    /// Pause a schedule: it fires nothing until resumed.
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleRecord, Error> {
        self.set_paused(name, true).await
    }

    /// Resume a schedule from its first tick after now.
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleRecord, Error> {
        self.set_paused(name, false).await
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<ScheduleRecord, Error> {
        Ok(self
            .storage()
            .schedule_set_paused(&SchedulePauseParams {
                name: name.to_owned(),
                paused,
                now: None,
            })
            .await?)
    }

    /// Delete a schedule; the tasks it enqueued stay. A schedule a worker declares in
    /// code comes back when that worker starts again.
    pub async fn remove_schedule(&self, name: &str) -> Result<(), Error> {
        Ok(self.storage().schedule_remove(name).await?)
    }

    /// Fire the due ticks now, as a worker's scheduler does (`at` overrides the
    /// database clock, for tests).
    pub async fn fire_due_schedules(
        &self,
        at: Option<DateTime<Utc>>,
    ) -> Result<Vec<FiredTick>, Error> {
        Ok(self
            .storage()
            .schedule_fire_due(&ScheduleFireParams {
                limit: FIRE_BATCH,
                now: at,
                grace: tenax_core::MissedTicks::GRACE,
            })
            .await?)
    }
}

impl Worker {
    /// Declare a periodic schedule: stored (or updated) when the worker starts, then
    /// fired by the scheduler of whichever worker gets to it first. An invalid schedule
    /// is refused here with the reason.
    pub fn with_schedule(mut self, schedule: tenax_core::Schedule) -> Result<Self, Error> {
        let def = schedule.build()?;
        if self.schedules.iter().any(|s| s.name == def.name) {
            return Err(tenax_core::InvalidInput::new(
                "schedule name",
                format!("{:?} is declared twice", def.name),
            )
            .into());
        }
        self.schedules.push(def);
        Ok(self)
    }
}

/// Upsert the worker's schedules, retrying until the storage answers or `stop`.
async fn declare(storage: &Arc<dyn Storage>, schedules: &[ScheduleDef], stop: &CancellationToken) {
    for def in schedules {
        let mut failures = 0u32;
        loop {
            let params = ScheduleUpsertParams {
                def: def.clone(),
                now: None,
            };
            match storage.schedule_upsert(&params).await {
                Ok((record, change)) => {
                    info!(schedule = %def.name, cadence = %def.cadence, ?change, next = ?record.next_fire_at, "schedule declared");
                    break;
                }
                Err(e) if e.is_transient() => {
                    failures = failures.saturating_add(1);
                    warn!(schedule = %def.name, error = %e, "cannot declare schedule yet; retrying");
                    let wait = Duration::from_millis(100u64 << failures.min(6));
                    if !jittered(wait, stop).await {
                        return;
                    }
                }
                Err(e) => {
                    warn!(schedule = %def.name, error = %e, "schedule refused");
                    break;
                }
            }
        }
    }
}

/// Fire due ticks until none is due.
async fn fire_due(storage: &Arc<dyn Storage>, grace: Duration) {
    // Each call advances every schedule it fires past now, so this ends; the bound
    // only keeps a pathological clock from spinning.
    for _ in 0..10 {
        let fired = storage
            .schedule_fire_due(&ScheduleFireParams {
                limit: FIRE_BATCH,
                now: None,
                grace,
            })
            .await;
        match fired {
            Ok(fired) if fired.is_empty() => return,
            Ok(fired) => {
                for tick in &fired {
                    let task_no = tenax_core::schedule::tick_task_no(&tick.schedule, tick.tick);
                    debug!(%task_no, task = ?tick.task, "tick fired");
                }
                info!(ticks = fired.len(), "schedules fired");
            }
            Err(e) => {
                warn!(error = %e, "scheduler pass failed");
                return;
            }
        }
    }
}

/// Declare `schedules`, then (when `enabled`) fire due ticks every `interval`, those
/// of skipping schedules at most `grace` late, until `stop`.
pub(crate) async fn scheduler_loop(
    storage: Arc<dyn Storage>,
    schedules: Vec<ScheduleDef>,
    enabled: bool,
    interval: Duration,
    grace: Duration,
    stop: CancellationToken,
) {
    declare(&storage, &schedules, &stop).await;
    if !enabled {
        return;
    }
    loop {
        fire_due(&storage, grace).await;
        if !jittered(interval, &stop).await {
            return;
        }
    }
}
