//! What every backend does the same way for periodic schedules: the stored form of a
//! definition, decoding it back, and deciding what an upsert changes.
//!
//! A backend fires a schedule in one transaction: it locks the due schedule rows
//! (`FOR UPDATE SKIP LOCKED` where the database has it, the write lock on SQLite),
//! asks [`tenax_core::schedule::plan_fire`] which ticks fire, inserts one task per tick
//! under the tick's task number (a number that exists already is left alone), and
//! advances `next_fire_at` with a write conditional on the value it read.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::schedule::tick_task_no;
use tenax_core::{Cadence, MissedTicks, Priority, ScheduleDef, TaskNo};

use crate::common::same_payload;
use crate::error::{Result, StorageError};
use crate::params::{ScheduleRecord, ScheduleUpserted};

/// A definition as the columns of `tenax_schedules` hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScheduleColumns {
    pub(crate) kind: &'static str,
    pub(crate) cron: Option<String>,
    pub(crate) timezone: Option<String>,
    pub(crate) interval_s: Option<i64>,
    pub(crate) missed: &'static str,
    pub(crate) catch_up: i64,
}

impl ScheduleColumns {
    pub(crate) fn of(def: &ScheduleDef) -> Self {
        let (cron, timezone, interval_s) = match &def.cadence {
            Cadence::Cron(c) => (
                Some(c.expression().to_owned()),
                Some(c.timezone().to_owned()),
                None,
            ),
            Cadence::Every(p) => (None, None, Some(i64::try_from(p.as_secs()).unwrap_or(0))),
        };
        let (missed, catch_up) = match def.missed {
            MissedTicks::Skip => ("skip", 0),
            MissedTicks::CatchUp(n) => ("catch_up", i64::from(n)),
        };
        Self {
            kind: def.cadence.kind(),
            cron,
            timezone,
            interval_s,
            missed,
            catch_up,
        }
    }
}

/// A `tenax_schedules` row read back, before decoding.
#[derive(Debug, Clone)]
pub(crate) struct ScheduleRow {
    pub(crate) name: String,
    pub(crate) kind: String,
    pub(crate) cron: Option<String>,
    pub(crate) timezone: Option<String>,
    pub(crate) interval_s: Option<i64>,
    pub(crate) command_type: String,
    pub(crate) payload: String,
    pub(crate) payload_version: i64,
    pub(crate) queue: String,
    pub(crate) priority: i64,
    pub(crate) max_attempts: i64,
    pub(crate) timeout_ms: i64,
    pub(crate) missed: String,
    pub(crate) catch_up: i64,
    pub(crate) paused: bool,
    pub(crate) next_fire_at: Option<DateTime<Utc>>,
    pub(crate) last_tick: Option<DateTime<Utc>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
}

fn corrupt(name: &str, what: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt(format!("schedule {name:?}: {what}"))
}

impl ScheduleRow {
    pub(crate) fn decode(self) -> Result<ScheduleRecord> {
        let name = &self.name;
        let cadence = match self.kind.as_str() {
            "cron" => Cadence::cron(
                self.cron.as_deref().unwrap_or_default(),
                self.timezone.as_deref(),
            ),
            "interval" => Cadence::every(Duration::from_secs(
                u64::try_from(self.interval_s.unwrap_or(0)).unwrap_or(0),
            )),
            other => return Err(corrupt(name, format!("unknown kind {other:?}"))),
        }
        .map_err(|e| corrupt(name, e))?;
        let missed = match self.missed.as_str() {
            "skip" => MissedTicks::Skip,
            "catch_up" => MissedTicks::CatchUp(
                u32::try_from(self.catch_up).map_err(|_| corrupt(name, "catch_up"))?,
            ),
            other => return Err(corrupt(name, format!("unknown missed policy {other:?}"))),
        };
        let small = |v: i64, what: &str| u32::try_from(v).map_err(|_| corrupt(name, what));
        let def = ScheduleDef {
            name: self.name.clone(),
            cadence,
            missed,
            command_type: self.command_type,
            payload: self.payload,
            payload_version: small(self.payload_version, "payload_version")?,
            queue: self.queue,
            priority: u8::try_from(self.priority)
                .ok()
                .and_then(|p| Priority::new(p).ok())
                .ok_or_else(|| corrupt(name, "priority"))?,
            max_attempts: small(self.max_attempts, "max_attempts")?,
            timeout: Duration::from_millis(
                u64::try_from(self.timeout_ms).map_err(|_| corrupt(name, "timeout_ms"))?,
            ),
        };
        Ok(ScheduleRecord {
            def,
            paused: self.paused,
            next_fire_at: self.next_fire_at,
            last_tick: self.last_tick,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// What an upsert of `new` over `stored` does, and whether the cadence changed (then
/// the next fire time restarts from now).
pub(crate) fn upsert_change(stored: &ScheduleDef, new: &ScheduleDef) -> (ScheduleUpserted, bool) {
    let cadence_changed = stored.cadence != new.cadence;
    let same_payload = same_payload(&stored.payload, &new.payload);
    let same = !cadence_changed
        && same_payload
        && stored.missed == new.missed
        && stored.command_type == new.command_type
        && stored.payload_version == new.payload_version
        && stored.queue == new.queue
        && stored.priority == new.priority
        && stored.max_attempts == new.max_attempts
        && stored.timeout == new.timeout;
    if same {
        (ScheduleUpserted::Unchanged, false)
    } else {
        (ScheduleUpserted::Updated, cadence_changed)
    }
}

/// Check a definition before it reaches the database.
pub(crate) fn validate_def(def: &ScheduleDef) -> Result<()> {
    def.validate()?;
    Ok(())
}

/// The task number of a tick.
pub(crate) fn tick_no(name: &str, tick: DateTime<Utc>) -> Result<TaskNo> {
    Ok(TaskNo::new(tick_task_no(name, tick))?)
}

/// The refusal for a schedule that does not exist.
pub(crate) fn missing(name: &str) -> StorageError {
    StorageError::NotFound(format!("schedule {name:?}"))
}

/// The columns every schedule query selects, in [`ScheduleRow`]'s terms.
pub(crate) const SCHEDULE_COLUMNS: &str =
    "name, kind, cron, timezone, interval_s, command_type, payload, payload_version, queue, \
     priority, max_attempts, timeout_ms, missed, catch_up, paused, next_fire_at, last_tick, \
     created_at, updated_at";
