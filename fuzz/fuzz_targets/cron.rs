//! The cron parser: an arbitrary expression and time zone, then the next and previous
//! ticks around an arbitrary instant. Parsing may refuse; it must never panic, and the
//! ticks it computes must agree with each other. For plain expressions in zones
//! without daylight saving time, the next tick is also checked against an independent
//! brute-force reading (`tenax_fuzz::cron_oracle`): it must be a time the expression
//! names, and no such time may lie between the instant and it (searched second by
//! second for an hour, or minute by minute for two days).
#![no_main]
use chrono::{DateTime, Duration, TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use tenax_core::Cadence;
use tenax_fuzz::cron_oracle::Oracle;

const ZONES: &[Option<&str>] = &[
    None,
    Some("UTC"),
    Some("Europe/Paris"),
    Some("America/New_York"),
    Some("Australia/Lord_Howe"),
    Some("Asia/Kathmandu"),
    Some("Asia/Kolkata"),
];

/// Zones with one fixed offset over 1970-2200, where local time is UTC shifted.
const FIXED: &[Option<&str>] = &[None, Some("UTC"), Some("Asia/Kolkata")];

/// Check `next` (the parser's first tick after `at`) against the oracle.
fn differential(
    oracle: &Oracle,
    expression: &str,
    zone: Option<&str>,
    at: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
) {
    let Ok(tz) = zone.unwrap_or("UTC").parse::<chrono_tz::Tz>() else {
        return;
    };
    let (step, count) = if oracle.has_seconds() {
        (Duration::seconds(1), 3_600)
    } else {
        (Duration::minutes(1), 2 * 1_440)
    };
    // The first candidate strictly after `at`: the next whole second, or minute.
    let mut candidate = if oracle.has_seconds() {
        at + Duration::seconds(1)
    } else {
        let secs = at.timestamp();
        let Some(minute) = Utc.timestamp_opt(secs - secs.rem_euclid(60), 0).single() else {
            return;
        };
        minute + Duration::minutes(1)
    };
    for _ in 0..count {
        if oracle.matches(&candidate.with_timezone(&tz).naive_local()) {
            assert_eq!(
                next,
                Some(candidate),
                "{expression:?} in {zone:?} after {at}: the brute force finds {candidate}"
            );
            return;
        }
        candidate += step;
    }
    if let Some(next) = next {
        assert!(
            next >= candidate,
            "{expression:?} in {zone:?} after {at}: {next} is not a time the expression names"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 {
        return;
    }
    let (head, rest) = data.split_at(9);
    let zone = ZONES[usize::from(head[0]) % ZONES.len()];
    let mut secs = [0u8; 8];
    secs.copy_from_slice(&head[1..9]);
    // Any instant from 1970 to 2200.
    let secs = (u64::from_le_bytes(secs) % (230 * 365 * 86_400)) as i64;
    let Some(at) = Utc.timestamp_opt(secs, 0).single() else {
        return;
    };
    let Ok(expression) = std::str::from_utf8(rest) else {
        return;
    };
    let Ok(cadence) = Cadence::cron(expression, zone) else {
        return;
    };
    let next = cadence.next_after(at);
    if FIXED.contains(&zone) {
        if let Some(oracle) = Oracle::parse(expression) {
            differential(&oracle, expression, zone, at, next);
        }
    }
    if let Some(next) = next {
        assert!(
            next > at,
            "{expression:?} in {zone:?}: next {next} is not after {at}"
        );
        assert_eq!(
            cadence.last_at_or_before(next),
            Some(next),
            "{expression:?} in {zone:?}: {next} is a tick but not its own last tick"
        );
        // Between `at` and `next` there is no tick: the last tick at or before the
        // second before `next` is at or before `at`.
        if let Some(before) = cadence.last_at_or_before(next - Duration::seconds(1)) {
            assert!(
                before <= at,
                "{expression:?} in {zone:?}: a tick {before} between {at} and {next}"
            );
        }
    }
    if let Some(previous) = cadence.last_at_or_before(at) {
        assert!(
            previous <= at,
            "{expression:?}: last tick {previous} is after {at}"
        );
        if let Some(following) = cadence.next_after(previous) {
            assert!(following > previous);
        }
    }
    let _: Option<DateTime<Utc>> = next;
});
