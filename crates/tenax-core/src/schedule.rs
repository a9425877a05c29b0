//! Periodic schedules: cron expressions and fixed intervals, when they fire, and what
//! each tick enqueues.
//!
//! A schedule's ticks are instants in UTC. A cron expression is read on the wall
//! clock of its time zone (UTC unless given) and every tick is converted to UTC; an
//! interval ticks at whole multiples of its period since the Unix epoch, so every node
//! computes the same ticks without sharing any state but the schedule's row.
//!
//! Each tick becomes one task whose `task_no` is `sched:<name>:<tick in RFC 3339, UTC>`
//! ([`tick_task_no`]); the unique index on `task_no` and the guarded advance of the
//! schedule's next fire time in the same transaction make a tick fire once, however
//! many nodes run the scheduler.
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::Serialize;

use crate::{defaults_of, Command, CommandDefaults, InvalidInput, Priority, QueueName};

/// When a schedule fires: a cron expression in a time zone, or a fixed interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cadence {
    /// A cron expression (5 fields, or 6 with seconds first) read in a time zone.
    Cron(Box<CronCadence>),
    /// Every whole number of seconds, at multiples of the period since the Unix epoch.
    Every(Duration),
}

/// A parsed cron expression and the time zone it is read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronCadence {
    expression: String,
    timezone: Tz,
    cron: Cron,
}

impl CronCadence {
    /// The expression as given (trimmed).
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The IANA name of the time zone (`UTC` by default).
    pub fn timezone(&self) -> &str {
        self.timezone.name()
    }
}

/// The longest interval accepted: 366 days.
pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 3600);

impl Cadence {
    /// A cron expression read in `timezone` (an IANA name such as `Europe/Paris`; UTC
    /// when `None`). Five fields (`minute hour day-of-month month day-of-week`) or six
    /// with seconds first; names (`MON`, `JAN`), ranges, lists, steps, `L`, `#`, `W`
    /// and `@hourly`-style nicknames are accepted. A day of month and a day of week
    /// both restricted match when either matches, as in Vixie cron.
    pub fn cron(expression: &str, timezone: Option<&str>) -> Result<Self, InvalidInput> {
        let expression = expression.trim();
        let timezone = match timezone {
            None => Tz::UTC,
            Some(name) => Tz::from_str(name).map_err(|_| {
                InvalidInput::new(
                    "timezone",
                    format!("{name:?} is not an IANA time zone name (for example Europe/Paris)"),
                )
            })?,
        };
        let fields = expression.split_whitespace().count();
        if !expression.starts_with('@') && !(5..=6).contains(&fields) {
            return Err(InvalidInput::new(
                "cron",
                format!(
                    "{expression:?} has {fields} fields; give 5 (minute hour day month weekday) \
                     or 6 (second first)"
                ),
            ));
        }
        // An empty item in a list (`,`, `1,,2`) names nothing: croner would accept it and
        // then search for centuries for a tick, about a second of CPU per call.
        if let Some(field) = expression
            .split_whitespace()
            .find(|f| f.contains(',') && f.split(',').any(str::is_empty))
        {
            return Err(InvalidInput::new(
                "cron",
                format!("{expression:?}: the list {field:?} has an empty item"),
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(expression)
            .map_err(|e| {
                let reason = out_of_range(expression).unwrap_or_else(|| e.to_string());
                InvalidInput::new("cron", format!("{expression:?}: {reason}"))
            })?;
        let cadence = Self::Cron(Box::new(CronCadence {
            expression: expression.to_owned(),
            timezone,
            cron,
        }));
        // An expression such as "0 0 30 2 *" parses but names no real day.
        let reference = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(365 * 30);
        if cadence.next_after(reference).is_none() {
            return Err(InvalidInput::new(
                "cron",
                format!("{expression:?} never fires (it names no date that exists)"),
            ));
        }
        Ok(cadence)
    }

    /// Every `period`: a whole number of seconds, from 1 second to 366 days. Ticks are
    /// the multiples of the period since 1970-01-01T00:00:00Z (`every 1h` fires on the
    /// hour, UTC).
    pub fn every(period: Duration) -> Result<Self, InvalidInput> {
        if period.subsec_nanos() != 0 || period.is_zero() {
            return Err(InvalidInput::new(
                "every",
                format!("{period:?} must be a whole number of seconds, at least 1"),
            ));
        }
        if period > MAX_INTERVAL {
            return Err(InvalidInput::new("every", "must be at most 366 days"));
        }
        Ok(Self::Every(period))
    }

    /// The first tick strictly after `t`, or `None` when there is none (before the
    /// year 9999).
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let next = match self {
            Self::Cron(c) => c
                .cron
                .find_next_occurrence(&t.with_timezone(&c.timezone), false)
                .ok()?
                .with_timezone(&Utc),
            Self::Every(period) => {
                let p = i64::try_from(period.as_secs()).ok()?;
                let k = t.timestamp().div_euclid(p).checked_add(1)?;
                Utc.timestamp_opt(k.checked_mul(p)?, 0).single()?
            }
        };
        (next > t && chrono::Datelike::year(&next) <= 9999).then_some(next)
    }

    /// The last tick at or before `t`, if any.
    pub fn last_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let last = match self {
            Self::Cron(c) => c
                .cron
                .find_previous_occurrence(&t.with_timezone(&c.timezone), true)
                .ok()?
                .with_timezone(&Utc),
            Self::Every(period) => {
                let p = i64::try_from(period.as_secs()).ok()?;
                let k = t.timestamp().div_euclid(p);
                Utc.timestamp_opt(k.checked_mul(p)?, 0).single()?
            }
        };
        (last <= t).then_some(last)
    }

    /// `cron` or `interval`, as stored.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Cron(_) => "cron",
            Self::Every(_) => "interval",
        }
    }
}

/// Which field of a 5- or 6-field expression holds a number out of its range, for a
/// message that says where the mistake is.
fn out_of_range(expression: &str) -> Option<String> {
    const FIELDS: [(&str, u32, u32); 6] = [
        ("second", 0, 59),
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day of month", 1, 31),
        ("month", 1, 12),
        ("day of week", 0, 7),
    ];
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let fields = match parts.len() {
        5 => &FIELDS[1..],
        6 => &FIELDS[..],
        _ => return None,
    };
    for (part, (name, min, max)) in parts.iter().zip(fields) {
        for item in part.split(',') {
            // The value before a step (`/n`) or an nth weekday (`#n`).
            let base = item.split(['/', '#']).next().unwrap_or_default();
            for number in base.split('-') {
                let digits: String = number.chars().filter(char::is_ascii_digit).collect();
                if let Ok(value) = digits.parse::<u32>() {
                    if value < *min || value > *max {
                        return Some(format!("{name} {value} is outside {min}-{max}"));
                    }
                }
            }
        }
    }
    None
}

impl fmt::Display for Cadence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cron(c) if c.timezone == Tz::UTC => write!(f, "cron {:?}", c.expression),
            Self::Cron(c) => write!(f, "cron {:?} in {}", c.expression, c.timezone.name()),
            Self::Every(p) => write!(f, "every {}s", p.as_secs()),
        }
    }
}

/// What happens to ticks that passed while no scheduler ran (an outage, a deploy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissedTicks {
    /// Ticks later than the scheduler's grace ([`MissedTicks::GRACE`] by default, the
    /// worker's `missed_tick_grace`) are skipped; the schedule goes on from the next
    /// tick. Ticks within the grace fire (a scheduler that is a few polls late loses
    /// nothing). The default.
    #[default]
    Skip,
    /// Fire the most recent ticks that are due, at most this many (1 to
    /// [`MissedTicks::MAX_CATCH_UP`]), however late; older ones are skipped.
    CatchUp(u32),
}

impl MissedTicks {
    /// How late a tick may be and still fire under [`MissedTicks::Skip`], unless the
    /// scheduler is given another grace.
    pub const GRACE: Duration = Duration::from_secs(60);
    /// The most ticks one schedule fires at once.
    pub const MAX_CATCH_UP: u32 = 1000;

    /// Check the bound of [`MissedTicks::CatchUp`].
    pub fn validate(self) -> Result<Self, InvalidInput> {
        match self {
            Self::CatchUp(n) if n == 0 || n > Self::MAX_CATCH_UP => Err(InvalidInput::new(
                "catch_up",
                format!("{n} must be between 1 and {}", Self::MAX_CATCH_UP),
            )),
            other => Ok(other),
        }
    }
}

impl fmt::Display for MissedTicks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Skip => f.write_str("skip"),
            Self::CatchUp(n) => write!(f, "catch up {n}"),
        }
    }
}

/// The ticks to fire now and the next fire time after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirePlan {
    /// Ticks to fire, oldest first (each at or before now).
    pub ticks: Vec<DateTime<Utc>>,
    /// The first tick after now (`None`: the schedule never fires again).
    pub next: Option<DateTime<Utc>>,
}

/// Which ticks of a schedule due since `next_fire_at` fire at `now`, under `missed`;
/// under [`MissedTicks::Skip`], ticks more than `grace` late are skipped.
///
/// Walks back from the last tick at or before `now`, so a long outage costs at most
/// [`MissedTicks::MAX_CATCH_UP`] steps, never one per missed tick.
pub fn plan_fire(
    cadence: &Cadence,
    next_fire_at: DateTime<Utc>,
    now: DateTime<Utc>,
    missed: MissedTicks,
    grace: Duration,
) -> FirePlan {
    let next = cadence.next_after(now);
    if next_fire_at > now {
        return FirePlan {
            ticks: Vec::new(),
            next: Some(next_fire_at),
        };
    }
    let grace = TimeDelta::from_std(grace).unwrap_or(TimeDelta::MAX);
    let (oldest, limit) = match missed {
        MissedTicks::Skip => (
            next_fire_at.max(now.checked_sub_signed(grace).unwrap_or(now)),
            MissedTicks::MAX_CATCH_UP,
        ),
        MissedTicks::CatchUp(n) => (next_fire_at, n.min(MissedTicks::MAX_CATCH_UP)),
    };
    let mut ticks = Vec::new();
    let mut cursor = cadence.last_at_or_before(now);
    while let Some(tick) = cursor {
        if tick < oldest || ticks.len() >= limit as usize {
            break;
        }
        ticks.push(tick);
        cursor = tick
            .checked_sub_signed(TimeDelta::milliseconds(1))
            .and_then(|before| cadence.last_at_or_before(before));
    }
    ticks.reverse();
    FirePlan { ticks, next }
}

/// The prefix of every task number a schedule enqueues.
pub const TICK_TASK_NO_PREFIX: &str = "sched:";

/// The task number of one tick: `sched:<name>:<tick, RFC 3339 UTC, whole seconds>`.
/// The unique index on task numbers makes a tick fire once.
pub fn tick_task_no(name: &str, tick: DateTime<Utc>) -> String {
    format!(
        "{TICK_TASK_NO_PREFIX}{name}:{}",
        tick.to_rfc3339_opts(SecondsFormat::Secs, true)
    )
}

/// The longest schedule name, in bytes (the tick's task number must fit in
/// [`TaskNo::MAX_LEN`](crate::TaskNo::MAX_LEN)).
pub const SCHEDULE_NAME_MAX_LEN: usize = 100;

/// Check a schedule name: 1 to 100 bytes of letters, digits, `-`, `_` and `.`, not
/// dots alone (`.` and `..` would be path segments in `/v1/schedules/{name}`).
pub fn validate_schedule_name(name: &str) -> Result<(), InvalidInput> {
    let valid = !name.is_empty()
        && name.len() <= SCHEDULE_NAME_MAX_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.chars().all(|c| c == '.');
    if valid {
        Ok(())
    } else {
        Err(InvalidInput::new(
            "schedule name",
            format!(
                "{name:?}: use 1 to {SCHEDULE_NAME_MAX_LEN} of a-z, A-Z, 0-9, -, _ and ., not dots alone"
            ),
        ))
    }
}

/// A periodic task: its name, when it fires, and the task each tick enqueues.
/// Build it with [`Schedule::cron`] or [`Schedule::every`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleDef {
    /// Unique name (1 to 100 bytes of `a-z A-Z 0-9 - _ .`).
    pub name: String,
    /// When it fires.
    pub cadence: Cadence,
    /// What happens to ticks missed during an outage.
    pub missed: MissedTicks,
    /// The command type each tick enqueues.
    pub command_type: String,
    /// The context, as JSON text.
    pub payload: String,
    /// The payload's shape version (at least 1).
    pub payload_version: u32,
    /// Queue of the enqueued tasks.
    pub queue: String,
    /// Priority of the enqueued tasks.
    pub priority: Priority,
    /// Attempt budget of each enqueued task (at least 1).
    pub max_attempts: u32,
    /// Per-attempt timeout of each enqueued task.
    pub timeout: Duration,
}

impl ScheduleDef {
    /// Check every field: the name, the command type, the queue, the payload (JSON),
    /// the attempt budget, the timeout and the missed-tick policy.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        validate_schedule_name(&self.name)?;
        crate::validate_command_type(&self.command_type)?;
        QueueName::new(self.queue.clone())?;
        serde_json::from_str::<serde_json::Value>(&self.payload)
            .map_err(|e| InvalidInput::new("payload", format!("is not JSON: {e}")))?;
        if self.payload_version == 0 {
            return Err(InvalidInput::new("payload_version", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(InvalidInput::new("max_attempts", "must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(InvalidInput::new("timeout", "must be positive"));
        }
        self.missed.validate()?;
        Ok(())
    }
}

/// A schedule being declared in code; any error is kept and reported by
/// [`Schedule::build`].
///
/// ```
/// use tenax_core::{Command, CommandError, MissedTicks, Schedule, TaskContext};
/// # struct Report;
/// # impl Command for Report {
/// #     const TYPE: &'static str = "DAILY_REPORT";
/// #     type Context = String;
/// #     type Output = ();
/// #     async fn execute(&self, _: String, _: &TaskContext) -> Result<(), CommandError> { Ok(()) }
/// # }
/// let def = Schedule::cron("daily-report", "0 30 6 * * MON-FRI")
///     .timezone("Europe/Paris")
///     .missed(MissedTicks::CatchUp(1))
///     .command::<Report>("sales".to_owned())
///     .build()?;
/// assert_eq!(def.command_type, "DAILY_REPORT");
///
/// let bad = Schedule::cron("typo", "0 61 * * *").command::<Report>(String::new()).build();
/// assert!(bad.unwrap_err().to_string().contains("cron"));
/// # Ok::<(), tenax_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a schedule does nothing until registered"]
pub struct Schedule {
    name: String,
    cron: Option<(String, Option<String>)>,
    every: Option<Duration>,
    missed: MissedTicks,
    command: Option<CommandOf>,
    error: Option<InvalidInput>,
}

#[derive(Debug, Clone)]
struct CommandOf {
    command_type: String,
    payload: String,
    payload_version: u32,
    queue: String,
    priority: u8,
    max_attempts: u32,
    timeout: Duration,
}

impl Schedule {
    /// A schedule on a cron expression (UTC unless [`timezone`](Self::timezone)).
    pub fn cron(name: impl Into<String>, expression: impl Into<String>) -> Self {
        Self::new(name.into(), Some((expression.into(), None)), None)
    }

    /// A schedule every `period` (whole seconds).
    pub fn every(name: impl Into<String>, period: Duration) -> Self {
        Self::new(name.into(), None, Some(period))
    }

    fn new(name: String, cron: Option<(String, Option<String>)>, every: Option<Duration>) -> Self {
        Self {
            name,
            cron,
            every,
            missed: MissedTicks::default(),
            command: None,
            error: None,
        }
    }

    /// The IANA time zone a cron expression is read in.
    pub fn timezone(mut self, timezone: impl Into<String>) -> Self {
        match &mut self.cron {
            Some((_, tz)) => *tz = Some(timezone.into()),
            None => {
                self.error.get_or_insert(InvalidInput::new(
                    "timezone",
                    "applies to cron schedules only; an interval ticks in UTC",
                ));
            }
        }
        self
    }

    /// What happens to ticks missed during an outage. Defaults to
    /// [`MissedTicks::Skip`].
    pub fn missed(mut self, missed: MissedTicks) -> Self {
        self.missed = missed;
        self
    }

    /// Each tick enqueues a task of command `C` with this context and `C`'s defaults.
    pub fn command<C: Command>(mut self, context: C::Context) -> Self {
        match serde_json::to_string(&context) {
            Ok(payload) => self.set_command(C::TYPE, payload, C::VERSION, &defaults_of::<C>()),
            Err(e) => {
                self.error
                    .get_or_insert(InvalidInput::new("context", e.to_string()));
            }
        }
        self
    }

    /// Each tick enqueues a task by type name and JSON payload (payload version 1).
    pub fn command_raw(mut self, command_type: &str, payload: &impl Serialize) -> Self {
        match serde_json::to_string(payload) {
            Ok(payload) => self.set_command(command_type, payload, 1, &CommandDefaults::STANDARD),
            Err(e) => {
                self.error
                    .get_or_insert(InvalidInput::new("payload", e.to_string()));
            }
        }
        self
    }

    fn set_command(
        &mut self,
        command_type: &str,
        payload: String,
        version: u32,
        d: &CommandDefaults,
    ) {
        self.command = Some(CommandOf {
            command_type: command_type.to_owned(),
            payload,
            payload_version: version,
            queue: d.queue.to_owned(),
            priority: d.priority,
            max_attempts: d.max_attempts,
            timeout: d.timeout,
        });
    }

    fn map_command(mut self, f: impl FnOnce(&mut CommandOf)) -> Self {
        match &mut self.command {
            Some(command) => f(command),
            None => {
                self.error.get_or_insert(InvalidInput::new(
                    "schedule",
                    "set the command before its queue, priority, attempts or timeout",
                ));
            }
        }
        self
    }

    /// The queue of the enqueued tasks. Defaults to the command's.
    pub fn queue(self, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        self.map_command(|c| c.queue = queue)
    }

    /// The priority (0-9) of the enqueued tasks. Defaults to the command's.
    pub fn priority(self, priority: u8) -> Self {
        self.map_command(|c| c.priority = priority)
    }

    /// The attempt budget of each enqueued task. Defaults to the command's.
    pub fn max_attempts(self, max_attempts: u32) -> Self {
        self.map_command(|c| c.max_attempts = max_attempts)
    }

    /// The per-attempt timeout of each enqueued task. Defaults to the command's.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.map_command(|c| c.timeout = timeout)
    }

    /// The checked definition, or what is wrong with it.
    pub fn build(self) -> Result<ScheduleDef, InvalidInput> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let cadence = match (&self.cron, self.every) {
            (Some((expression, tz)), _) => Cadence::cron(expression, tz.as_deref())?,
            (None, Some(period)) => Cadence::every(period)?,
            (None, None) => return Err(InvalidInput::new("schedule", "needs a cadence")),
        };
        let command = self.command.ok_or_else(|| {
            InvalidInput::new("schedule", "needs a command (call .command::<C>(context))")
        })?;
        let def = ScheduleDef {
            name: self.name,
            cadence,
            missed: self.missed,
            command_type: command.command_type,
            payload: command.payload,
            payload_version: command.payload_version,
            queue: command.queue,
            priority: Priority::new(command.priority)?,
            max_attempts: command.max_attempts,
            timeout: command.timeout,
        };
        def.validate()?;
        Ok(def)
    }
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
