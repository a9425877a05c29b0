//! An independent, brute-force reading of plain cron expressions, for the cron target's
//! differential check: numbers, `*`, ranges, steps and lists only (no names, `?`, `L`,
//! `W` or `#`), five fields or six with seconds first. Whatever it does not understand
//! it declines (`None`), and the target then checks only the parser's own consistency.
use chrono::{Datelike, NaiveDateTime, Timelike};

/// The instants a plain cron expression names, as bit sets per field.
#[derive(Debug, Clone)]
pub struct Oracle {
    seconds: Option<u64>,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Day of month or weekday given as exactly `*`: the two then combine with AND,
    /// otherwise with OR (Vixie cron).
    any_day: bool,
}

impl Oracle {
    /// Read `expression`, or decline it.
    pub fn parse(expression: &str) -> Option<Oracle> {
        let fields: Vec<&str> = expression.split_whitespace().collect();
        let (seconds, rest) = match fields.len() {
            5 => (None, &fields[..]),
            6 => (Some(field(fields[0], 0, 59)?), &fields[1..]),
            _ => return None,
        };
        let minutes = field(rest[0], 0, 59)?;
        let hours = field(rest[1], 0, 23)?;
        let days = field(rest[2], 1, 31)?;
        let months = field(rest[3], 1, 12)?;
        let mut weekdays = field(rest[4], 0, 7)?;
        // 7 is Sunday, like 0.
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & !(1 << 7)) | 1;
        }
        let (dom, dow) = (rest[2], rest[4]);
        // `*/2` in one day field with the other restricted: cron dialects disagree on
        // whether it counts as `*`, so leave it to the parser alone.
        if dom != "*" && dow != "*" && (dom.starts_with('*') || dow.starts_with('*')) {
            return None;
        }
        Some(Oracle {
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            any_day: dom == "*" || dow == "*",
        })
    }

    /// Whether the expression has a seconds field (otherwise it fires at second 0).
    pub fn has_seconds(&self) -> bool {
        self.seconds.is_some()
    }

    /// Whether the local time `t` (whole seconds) is one the expression names.
    pub fn matches(&self, t: &NaiveDateTime) -> bool {
        let bit = |set: u64, v: u32| set & (1u64 << v) != 0;
        let second = match self.seconds {
            Some(set) => bit(set, t.second()),
            None => t.second() == 0,
        };
        let dom = bit(self.days, t.day());
        let dow = bit(self.weekdays, t.weekday().num_days_from_sunday());
        let day = if self.any_day { dom && dow } else { dom || dow };
        second
            && bit(self.minutes, t.minute())
            && bit(self.hours, t.hour())
            && bit(self.months, t.month())
            && day
    }
}

/// One field's values as a bit set, or `None` for anything outside plain syntax.
fn field(text: &str, min: u32, max: u32) -> Option<u64> {
    let number = |s: &str| -> Option<u32> {
        if s.is_empty() || s.len() > 3 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let mut set = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(number(step)?)),
            None => (item, None),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (number(a)?, number(b)?)
        } else {
            let a = number(range)?;
            (a, if step.is_some() { max } else { a })
        };
        if lo < min || hi > max || lo > hi || step == Some(0) {
            return None;
        }
        let step = step.unwrap_or(1) as usize;
        for v in (lo..=hi).step_by(step) {
            set |= 1u64 << v;
        }
    }
    Some(set)
}
