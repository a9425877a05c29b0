use chrono::{Datelike, NaiveDate, NaiveDateTime, Timelike};
use proptest::prelude::*;

use super::*;

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// One cron field as generated: its text and the values it allows.
#[derive(Debug, Clone)]
struct Field {
    text: String,
    allowed: Vec<u32>,
    star: bool,
}

fn field(min: u32, max: u32, steps: bool) -> impl Strategy<Value = Field> {
    let any = Just(Field {
        text: "*".into(),
        allowed: (min..=max).collect(),
        star: true,
    });
    let list = proptest::collection::btree_set(min..=max, 1..4).prop_map(|set| Field {
        text: set.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        allowed: set.into_iter().collect(),
        star: false,
    });
    let range = (min..=max, min..=max).prop_map(|(a, b)| {
        let (a, b) = (a.min(b), a.max(b));
        Field {
            text: format!("{a}-{b}"),
            allowed: (a..=b).collect(),
            star: false,
        }
    });
    let step = (min..=max, 2..=(max - min + 1).max(2)).prop_map(move |(a, n)| Field {
        text: format!("{a}-{max}/{n}"),
        allowed: (a..=max).step_by(n as usize).collect(),
        star: false,
    });
    if steps {
        prop_oneof![any, list, range, step].boxed()
    } else {
        prop_oneof![any, list, range].boxed()
    }
}

/// A random expression (5 or 6 fields) and its oracle.
#[derive(Debug, Clone)]
struct Expr {
    text: String,
    second: Option<Field>,
    minute: Field,
    hour: Field,
    dom: Field,
    month: Field,
    dow: Field,
}

fn expr() -> impl Strategy<Value = Expr> {
    (
        proptest::option::of(field(0, 59, true)),
        field(0, 59, true),
        field(0, 23, true),
        // Days 1-28 and no steps on the day fields, so that every expression fires
        // every year and "*" is the only wildcard (as in Vixie cron).
        field(1, 28, false),
        field(1, 12, true),
        field(0, 6, false),
    )
        .prop_map(|(second, minute, hour, dom, month, dow)| {
            let mut parts = Vec::new();
            if let Some(s) = &second {
                parts.push(s.text.clone());
            }
            for f in [&minute, &hour, &dom, &month, &dow] {
                parts.push(f.text.clone());
            }
            Expr {
                text: parts.join(" "),
                second,
                minute,
                hour,
                dom,
                month,
                dow,
            }
        })
}

impl Expr {
    fn day_matches(&self, t: &NaiveDateTime) -> bool {
        let dom = self.dom.star || self.dom.allowed.contains(&t.day());
        let dow = self
            .dow
            .allowed
            .contains(&t.weekday().num_days_from_sunday());
        if self.dom.star || self.dow.star {
            dom && dow
        } else {
            dom || dow
        }
    }

    fn second_allowed(&self, s: u32) -> bool {
        self.second
            .as_ref()
            .map_or(s == 0, |f| f.allowed.contains(&s))
    }

    /// The first local time at or after `t` that matches, walking field by field.
    fn first_match_from(&self, mut t: NaiveDateTime, end: NaiveDateTime) -> Option<NaiveDateTime> {
        while t < end {
            if !self.month.allowed.contains(&t.month()) {
                let (y, m) = if t.month() == 12 {
                    (t.year() + 1, 1)
                } else {
                    (t.year(), t.month() + 1)
                };
                t = NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?;
            } else if !self.day_matches(&t) {
                t = t.date().succ_opt()?.and_hms_opt(0, 0, 0)?;
            } else if !self.hour.allowed.contains(&t.hour()) {
                t = t.with_minute(0)?.with_second(0)? + TimeDelta::hours(1);
            } else if !self.minute.allowed.contains(&t.minute()) {
                t = t.with_second(0)? + TimeDelta::minutes(1);
            } else if !self.second_allowed(t.second()) {
                t += TimeDelta::seconds(1);
            } else {
                return Some(t);
            }
        }
        None
    }
}

/// Zones without daylight saving time over the tested years: walking local time there
/// is walking UTC with an offset.
const FIXED_ZONES: [&str; 4] = ["UTC", "Asia/Kolkata", "Asia/Tokyo", "Etc/GMT+3"];

fn instant() -> impl Strategy<Value = DateTime<Utc>> {
    // 2001 to 2099, at millisecond resolution.
    (978_307_200_000i64..4_102_444_800_000i64)
        .prop_map(|ms| DateTime::from_timestamp_millis(ms).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn cron_next_is_later_and_nothing_matches_in_between(
        e in expr(),
        zone in 0..FIXED_ZONES.len(),
        t in instant(),
    ) {
        let cadence = Cadence::cron(&e.text, Some(FIXED_ZONES[zone])).unwrap();
        let tz = Tz::from_str(FIXED_ZONES[zone]).unwrap();
        let next = cadence.next_after(t).expect("every generated expression fires");
        prop_assert!(next > t, "{} after {t}: {next}", e.text);
        // The first whole local second after t.
        let start = (t.with_timezone(&tz).naive_local().with_nanosecond(0).unwrap())
            + TimeDelta::seconds(1);
        let next_local = next.with_timezone(&tz).naive_local();
        let found = e.first_match_from(start, next_local + TimeDelta::seconds(1));
        prop_assert_eq!(found, Some(next_local), "{} after {}", e.text, t);
    }

    #[test]
    fn interval_next_is_the_next_multiple(period in 1u64..=400_000, t in instant()) {
        let cadence = Cadence::every(Duration::from_secs(period)).unwrap();
        let next = cadence.next_after(t).unwrap();
        prop_assert!(next > t);
        let gap = (next - t).num_milliseconds();
        prop_assert!(gap <= i64::try_from(period * 1000).unwrap(), "a multiple lies in between");
        prop_assert_eq!(next.timestamp() % i64::try_from(period).unwrap(), 0);
        prop_assert_eq!(next.timestamp_subsec_nanos(), 0);
        let last = cadence.last_at_or_before(t).unwrap();
        prop_assert!(last <= t && cadence.next_after(last) == Some(next));
    }

    #[test]
    fn a_fire_plan_is_bounded_ordered_and_contiguous(
        e in expr(),
        t in instant(),
        late_s in 0i64..400_000,
        catch_up in proptest::option::of(1u32..20),
    ) {
        let cadence = Cadence::cron(&e.text, None).unwrap();
        let next_fire_at = cadence.next_after(t).unwrap();
        let now = next_fire_at + TimeDelta::seconds(late_s);
        let missed = catch_up.map_or(MissedTicks::Skip, MissedTicks::CatchUp);
        let plan = plan_fire(&cadence, next_fire_at, now, missed, MissedTicks::GRACE);
        prop_assert!(plan.next.unwrap() > now);
        let limit = catch_up.unwrap_or(MissedTicks::MAX_CATCH_UP) as usize;
        prop_assert!(plan.ticks.len() <= limit);
        prop_assert!(!plan.ticks.is_empty() || missed == MissedTicks::Skip);
        for pair in plan.ticks.windows(2) {
            prop_assert_eq!(cadence.next_after(pair[0]), Some(pair[1]));
        }
        if let Some(last) = plan.ticks.last() {
            prop_assert_eq!(cadence.next_after(*last), plan.next, "the latest due tick fires");
        }
        for tick in &plan.ticks {
            prop_assert!(*tick >= next_fire_at && *tick <= now);
            if missed == MissedTicks::Skip {
                prop_assert!(now - *tick <= TimeDelta::from_std(MissedTicks::GRACE).unwrap());
            }
        }
    }
}

#[test]
fn seconds_are_optional() {
    let five = Cadence::cron("*/5 * * * *", None).unwrap();
    let six = Cadence::cron("0 */5 * * * *", None).unwrap();
    let t = utc("2026-01-01T10:02:07Z");
    assert_eq!(five.next_after(t), Some(utc("2026-01-01T10:05:00Z")));
    assert_eq!(six.next_after(t), five.next_after(t));
    let every_second = Cadence::cron("* * * * * *", None).unwrap();
    assert_eq!(
        every_second.next_after(utc("2026-01-01T10:02:07.250Z")),
        Some(utc("2026-01-01T10:02:08Z"))
    );
}

#[test]
fn invalid_expressions_say_what_is_wrong() {
    let cases = [
        ("", "fields"),
        ("* * * *", "4 fields"),
        ("* * * * * * *", "7 fields"),
        ("0 61 * * *", "hour 61 is outside 0-23"),
        ("61 * * * *", "minute 61 is outside 0-59"),
        ("0 0 * * * 8", "day of week 8 is outside 0-7"),
        ("*/0 * * * *", "Step cannot be zero"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 * * FOO", "cron"),
    ];
    for (expression, expected) in cases {
        let err = Cadence::cron(expression, None).unwrap_err();
        assert_eq!(err.field, "cron", "{expression:?}: {err}");
        assert!(
            err.to_string().contains(expected),
            "{expression:?}: {err} should mention {expected:?}"
        );
    }
    let err = Cadence::cron("* * * * *", Some("Mars/Olympus")).unwrap_err();
    assert!(err.to_string().contains("Mars/Olympus"), "{err}");
    assert!(Cadence::every(Duration::from_millis(1500)).is_err());
    assert!(Cadence::every(Duration::ZERO).is_err());
    assert!(Cadence::every(MAX_INTERVAL + Duration::from_secs(1)).is_err());
    assert!(MissedTicks::CatchUp(0).validate().is_err());
    assert!(MissedTicks::CatchUp(MissedTicks::MAX_CATCH_UP + 1)
        .validate()
        .is_err());
}

/// Europe/Paris moves from 02:00 CET to 03:00 CEST on 2026-03-29 and from 03:00 CEST
/// back to 02:00 CET on 2026-10-25.
#[test]
fn time_zones_fire_at_the_right_utc_instants_across_dst() {
    let daily = Cadence::cron("30 2 * * *", Some("Europe/Paris")).unwrap();
    let ticks = |cadence: &Cadence, from: &str, n: usize| {
        let mut t = utc(from);
        (0..n)
            .map(|_| {
                t = cadence.next_after(t).unwrap();
                t.to_rfc3339_opts(SecondsFormat::Secs, true)
            })
            .collect::<Vec<_>>()
    };
    // 02:30 does not exist on the day of the spring change: it runs at 03:00 CEST.
    assert_eq!(
        ticks(&daily, "2026-03-27T12:00:00Z", 4),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-31T00:30:00Z"
        ]
    );
    // 02:30 happens twice on the day of the autumn change: it runs once.
    assert_eq!(
        ticks(&daily, "2026-10-23T12:00:00Z", 4),
        [
            "2026-10-24T00:30:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-26T01:30:00Z",
            "2026-10-27T01:30:00Z"
        ]
    );
    // An hourly schedule fires every real hour, including the repeated one.
    let hourly = Cadence::cron("0 * * * *", Some("Europe/Paris")).unwrap();
    assert_eq!(
        ticks(&hourly, "2026-10-24T23:30:00Z", 4),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T02:00:00Z",
            "2026-10-25T03:00:00Z"
        ]
    );
}

#[test]
fn skip_drops_ticks_older_than_the_grace_and_catch_up_is_bounded() {
    let minutely = Cadence::cron("0 * * * * *", None).unwrap();
    let next_fire_at = utc("2026-01-01T10:00:00Z");
    let now = utc("2026-01-01T11:00:30Z");
    let skip = plan_fire(
        &minutely,
        next_fire_at,
        now,
        MissedTicks::Skip,
        MissedTicks::GRACE,
    );
    assert_eq!(skip.ticks, [utc("2026-01-01T11:00:00Z")]);
    assert_eq!(skip.next, Some(utc("2026-01-01T11:01:00Z")));
    let catch_up = plan_fire(
        &minutely,
        next_fire_at,
        now,
        MissedTicks::CatchUp(3),
        MissedTicks::GRACE,
    );
    assert_eq!(
        catch_up.ticks,
        [
            utc("2026-01-01T10:58:00Z"),
            utc("2026-01-01T10:59:00Z"),
            utc("2026-01-01T11:00:00Z")
        ]
    );
    let not_due = plan_fire(
        &minutely,
        now,
        next_fire_at,
        MissedTicks::Skip,
        MissedTicks::GRACE,
    );
    assert!(not_due.ticks.is_empty());
    assert_eq!(not_due.next, Some(now));
}

#[test]
fn tick_task_numbers_are_valid_and_distinct() {
    let name = "n".repeat(SCHEDULE_NAME_MAX_LEN);
    let no = tick_task_no(&name, utc("2026-01-01T10:00:00Z"));
    assert!(crate::TaskNo::new(no.clone()).is_ok(), "{no}");
    assert_eq!(
        tick_task_no("a", utc("2026-01-01T10:00:00Z")),
        "sched:a:2026-01-01T10:00:00Z"
    );
    assert!(validate_schedule_name("a b").is_err());
    for dots in [".", "..", "..."] {
        assert!(validate_schedule_name(dots).is_err(), "{dots}");
    }
    assert!(validate_schedule_name("v1.2").is_ok());
    assert!(validate_schedule_name("a/b").is_err());
    assert!(validate_schedule_name(&"n".repeat(SCHEDULE_NAME_MAX_LEN + 1)).is_err());
}

/// Found by the `cron` fuzz target (a libFuzzer timeout): `", 0 2-9 * *"` parsed, then
/// the check that it ever fires searched for about a second before giving up. An empty
/// list item is now refused before any search.
#[test]
fn fuzz_regression_an_empty_list_item_is_refused_before_any_search() {
    for expression in [", 0 2-9 * *", "1,,2 * * * *", "0 0 1, * *", "0 ,5 * * * *"] {
        let started = std::time::Instant::now();
        let err = Cadence::cron(expression, Some("Asia/Kathmandu")).unwrap_err();
        assert!(
            err.to_string().contains("empty item"),
            "{expression}: {err}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_millis(100),
            "{expression}: {:?}",
            started.elapsed()
        );
    }
    assert!(Cadence::cron("0,30 * * * *", None).is_ok());
}
