//! Conformance cases for periodic schedules. Time moves with the `now` overrides;
//! nothing sleeps.
use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use tenax_core::{MissedTicks, Schedule, ScheduleDef, TaskNo};

use super::{Harness, TaskOpts};
use crate::{
    FiredTick, ScheduleFireParams, SchedulePauseParams, ScheduleUpsertParams, ScheduleUpserted,
    Storage, StorageError, TaskListParams, TaskRef,
};

fn utc(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn every(name: &str, secs: u64, missed: MissedTicks) -> ScheduleDef {
    Schedule::every(name, Duration::from_secs(secs))
        .missed(missed)
        .command_raw(TaskOpts::TYPE, &serde_json::json!({ "schedule": name }))
        .build()
        .unwrap()
}

async fn upsert(storage: &dyn Storage, def: &ScheduleDef, now: DateTime<Utc>) -> ScheduleUpserted {
    storage
        .schedule_upsert(&ScheduleUpsertParams {
            def: def.clone(),
            now: Some(now),
        })
        .await
        .unwrap()
        .1
}

async fn fire(storage: &dyn Storage, now: DateTime<Utc>) -> Vec<FiredTick> {
    storage
        .schedule_fire_due(&ScheduleFireParams {
            limit: 100,
            now: Some(now),
            grace: tenax_core::MissedTicks::GRACE,
        })
        .await
        .unwrap()
}

async fn next_fire_at(storage: &dyn Storage, name: &str) -> Option<DateTime<Utc>> {
    storage
        .schedule_list()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.def.name == name)
        .unwrap()
        .next_fire_at
}

fn ticks_of(fired: &[FiredTick], name: &str) -> Vec<String> {
    fired
        .iter()
        .filter(|f| f.schedule == name)
        .map(|f| rfc(f.tick))
        .collect()
}

/// Two storages (two nodes) fire the same schedule at the same instants: every tick is
/// fired by exactly one of them, and makes exactly one task.
pub async fn a_tick_fires_once_when_two_nodes_fire_together(h: &Harness) {
    let other = h.reopen().await;
    let t0 = utc("2026-06-01T00:00:00Z");
    let def = every("pair", 60, MissedTicks::CatchUp(5));
    assert_eq!(
        upsert(&*h.storage, &def, t0).await,
        ScheduleUpserted::Created
    );
    assert_eq!(
        next_fire_at(&*h.storage, "pair").await,
        Some(utc("2026-06-01T00:01:00Z"))
    );
    let mut fired = Vec::new();
    for k in 1..=10i64 {
        let now = t0 + TimeDelta::seconds(60 * k) + TimeDelta::milliseconds(250);
        let (a, b) = tokio::join!(fire(&*h.storage, now), fire(&*other, now));
        assert!(
            a.is_empty() || b.is_empty(),
            "tick {k} fired on both nodes: {a:?} {b:?}"
        );
        fired.extend(a);
        fired.extend(b);
    }
    let ticks: Vec<String> = ticks_of(&fired, "pair");
    let expected: Vec<String> = (1..=10)
        .map(|k| rfc(t0 + TimeDelta::seconds(60 * k)))
        .collect();
    assert_eq!(ticks, expected, "each tick once, in order");
    assert!(fired.iter().all(|f| f.task.is_some()), "{fired:?}");
    let tasks = h
        .storage
        .task_list(&TaskListParams {
            command_type: Some(TaskOpts::TYPE.to_owned()),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let numbers: BTreeSet<String> = tasks.iter().map(|t| t.task_no.to_string()).collect();
    let wanted: BTreeSet<String> = expected.iter().map(|t| format!("sched:pair:{t}")).collect();
    assert_eq!(numbers, wanted);
    let first = h
        .storage
        .task_get(&TaskRef::No(
            TaskNo::new("sched:pair:2026-06-01T00:01:00Z").unwrap(),
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first.run_at,
        utc("2026-06-01T00:01:00Z"),
        "runs at its tick"
    );
    assert_eq!(first.queue, "default");
    assert_eq!(first.payload_version, 1);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&first.payload).unwrap(),
        serde_json::json!({ "schedule": "pair" })
    );
}

/// After an outage, `Skip` fires only the ticks within the grace and `CatchUp(n)` the
/// latest `n`; both then go on from the first tick after now.
pub async fn missed_ticks_are_skipped_or_caught_up_within_the_bound(h: &Harness) {
    let t0 = utc("2026-06-01T00:00:00Z");
    upsert(&*h.storage, &every("skip", 60, MissedTicks::Skip), t0).await;
    upsert(
        &*h.storage,
        &every("catch", 60, MissedTicks::CatchUp(3)),
        t0,
    )
    .await;
    // Down for an hour.
    let now = utc("2026-06-01T01:00:30Z");
    let fired = fire(&*h.storage, now).await;
    assert_eq!(ticks_of(&fired, "skip"), ["2026-06-01T01:00:00Z"]);
    assert_eq!(
        ticks_of(&fired, "catch"),
        [
            "2026-06-01T00:58:00Z",
            "2026-06-01T00:59:00Z",
            "2026-06-01T01:00:00Z"
        ]
    );
    for name in ["skip", "catch"] {
        assert_eq!(
            next_fire_at(&*h.storage, name).await,
            Some(utc("2026-06-01T01:01:00Z")),
            "{name}"
        );
    }
    assert!(fire(&*h.storage, now).await.is_empty(), "nothing twice");
    // Down longer than the grace with Skip: nothing fires, the schedule moves on.
    let later = utc("2026-06-01T03:00:30Z") + TimeDelta::seconds(45);
    let fired = fire(&*h.storage, later).await;
    assert_eq!(ticks_of(&fired, "skip"), ["2026-06-01T03:01:00Z"]);
    assert_eq!(ticks_of(&fired, "catch").len(), 3);
    let stats = h.storage.stats().await.unwrap();
    assert_eq!(stats.total(), 1 + 3 + 1 + 3);
}

/// The scheduler's grace decides how late a skipping schedule's tick may fire: a tick
/// five minutes late is skipped under the default grace (one minute) and fires under a
/// grace of ten minutes; a tick later than any grace never fires.
pub async fn the_missed_tick_grace_is_the_schedulers_to_set(h: &Harness) {
    let t0 = utc("2026-06-01T00:00:00Z");
    upsert(&*h.storage, &every("hourly", 3600, MissedTicks::Skip), t0).await;
    let fire_with = |now: DateTime<Utc>, grace: Duration| {
        let storage = h.storage.clone();
        async move {
            storage
                .schedule_fire_due(&ScheduleFireParams {
                    limit: 100,
                    now: Some(now),
                    grace,
                })
                .await
                .unwrap()
        }
    };
    // The 01:00 tick, five minutes late: the default grace skips it.
    let fired = fire_with(utc("2026-06-01T01:05:00Z"), MissedTicks::GRACE).await;
    assert!(ticks_of(&fired, "hourly").is_empty(), "{fired:?}");
    assert_eq!(
        next_fire_at(&*h.storage, "hourly").await,
        Some(utc("2026-06-01T02:00:00Z"))
    );
    // The 02:00 tick, five minutes late, under a grace of ten minutes: it fires.
    let fired = fire_with(utc("2026-06-01T02:05:00Z"), Duration::from_secs(600)).await;
    assert_eq!(ticks_of(&fired, "hourly"), ["2026-06-01T02:00:00Z"]);
    // The 03:00 tick, fifteen minutes late: later than the grace, skipped.
    let fired = fire_with(utc("2026-06-01T03:15:00Z"), Duration::from_secs(600)).await;
    assert!(ticks_of(&fired, "hourly").is_empty(), "{fired:?}");
    assert_eq!(h.storage.stats().await.unwrap().total(), 1);
}

/// A paused schedule fires nothing; resumed, it goes on from its first tick after now
/// (the ticks it missed while paused never fire). Pause, resume and remove of a missing
/// schedule are refused.
pub async fn pause_and_resume_and_remove(h: &Harness) {
    let t0 = utc("2026-06-01T00:00:00Z");
    upsert(&*h.storage, &every("p", 60, MissedTicks::CatchUp(10)), t0).await;
    let pause = |name: &str, paused: bool, now: DateTime<Utc>| SchedulePauseParams {
        name: name.to_owned(),
        paused,
        now: Some(now),
    };
    let paused = h
        .storage
        .schedule_set_paused(&pause("p", true, t0))
        .await
        .unwrap();
    assert!(paused.paused);
    assert!(fire(&*h.storage, utc("2026-06-01T00:05:30Z"))
        .await
        .is_empty());
    // Declaring it again (a worker restart) keeps it paused.
    assert_eq!(
        upsert(&*h.storage, &every("p", 60, MissedTicks::CatchUp(10)), t0).await,
        ScheduleUpserted::Unchanged
    );
    let resumed = h
        .storage
        .schedule_set_paused(&pause("p", false, utc("2026-06-01T00:05:30Z")))
        .await
        .unwrap();
    assert!(!resumed.paused);
    assert_eq!(resumed.next_fire_at, Some(utc("2026-06-01T00:06:00Z")));
    let fired = fire(&*h.storage, utc("2026-06-01T00:07:10Z")).await;
    assert_eq!(
        ticks_of(&fired, "p"),
        ["2026-06-01T00:06:00Z", "2026-06-01T00:07:00Z"]
    );
    for paused in [true, false] {
        let err = h
            .storage
            .schedule_set_paused(&pause("nope", paused, t0))
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::NotFound(_)), "{err}");
    }
    h.storage.schedule_remove("p").await.unwrap();
    assert!(h.storage.schedule_list().await.unwrap().is_empty());
    let err = h.storage.schedule_remove("p").await.unwrap_err();
    assert!(matches!(err, StorageError::NotFound(_)), "{err}");
    assert!(fire(&*h.storage, utc("2026-06-01T00:09:10Z"))
        .await
        .is_empty());
    // The tasks it enqueued stay, and re-creating it never fires a tick twice.
    upsert(&*h.storage, &every("p", 60, MissedTicks::CatchUp(10)), t0).await;
    let fired = fire(&*h.storage, utc("2026-06-01T00:07:10Z")).await;
    assert!(fired.len() == 7 && fired.iter().filter(|f| f.task.is_some()).count() == 5);
    assert_eq!(h.storage.stats().await.unwrap().total(), 7);
}

/// An invalid definition is refused with the reason and changes nothing; an update of
/// the cadence restarts the schedule, any other update keeps its next fire time.
pub async fn an_invalid_schedule_changes_nothing(h: &Harness) {
    let t0 = utc("2026-06-01T00:00:00Z");
    let good = every("s", 3600, MissedTicks::Skip);
    upsert(&*h.storage, &good, t0).await;
    let before = h.storage.schedule_list().await.unwrap();
    let bad_defs = [
        ScheduleDef {
            name: "bad name".into(),
            ..good.clone()
        },
        ScheduleDef {
            payload: "{not json".into(),
            ..good.clone()
        },
        ScheduleDef {
            queue: "".into(),
            ..good.clone()
        },
        ScheduleDef {
            max_attempts: 0,
            ..good.clone()
        },
        ScheduleDef {
            missed: MissedTicks::CatchUp(0),
            ..good.clone()
        },
        ScheduleDef {
            command_type: "".into(),
            ..good.clone()
        },
    ];
    for def in bad_defs {
        let err = h
            .storage
            .schedule_upsert(&ScheduleUpsertParams {
                def: def.clone(),
                now: Some(t0 + TimeDelta::hours(5)),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Invalid(_)), "{def:?}: {err}");
    }
    let err = Schedule::cron("s", "0 0 31 2 *")
        .command_raw(TaskOpts::TYPE, &serde_json::json!({}))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("never fires"), "{err}");
    assert_eq!(h.storage.schedule_list().await.unwrap(), before);

    // Updates.
    let later = t0 + TimeDelta::minutes(90);
    let payload = ScheduleDef {
        payload: r#"{"v":2}"#.into(),
        ..good.clone()
    };
    assert_eq!(
        upsert(&*h.storage, &payload, later).await,
        ScheduleUpserted::Updated
    );
    assert_eq!(
        next_fire_at(&*h.storage, "s").await,
        Some(utc("2026-06-01T01:00:00Z")),
        "the same cadence keeps its next tick"
    );
    let faster = ScheduleDef {
        cadence: tenax_core::Cadence::cron("*/5 * * * *", None).unwrap(),
        ..payload
    };
    assert_eq!(
        upsert(&*h.storage, &faster, later).await,
        ScheduleUpserted::Updated
    );
    assert_eq!(
        next_fire_at(&*h.storage, "s").await,
        Some(utc("2026-06-01T01:35:00Z")),
        "a new cadence starts from now"
    );
    let stored = h.storage.schedule_list().await.unwrap();
    assert_eq!(stored[0].def, faster);
}

/// A schedule in Europe/Paris around both daylight-saving changes of 2026 fires at the
/// UTC instants of its local times: 02:30 (absent on 29 March) runs at 03:00 CEST, and
/// on 25 October (02:30 twice) it runs once; an hourly one fires every real hour.
pub async fn a_time_zone_schedule_fires_at_the_right_utc_instants_across_dst(h: &Harness) {
    let daily = Schedule::cron("paris-daily", "30 2 * * *")
        .timezone("Europe/Paris")
        .missed(MissedTicks::CatchUp(1))
        .command_raw(TaskOpts::TYPE, &serde_json::json!({}))
        .build()
        .unwrap();
    let hourly = Schedule::cron("paris-hourly", "0 0 * * * *")
        .timezone("Europe/Paris")
        .missed(MissedTicks::CatchUp(1))
        .command_raw(TaskOpts::TYPE, &serde_json::json!({}))
        .build()
        .unwrap();
    let walk = |from: &str, hours: i64, step_min: i64| {
        let from = utc(from);
        (0..=hours * 60 / step_min).map(move |i| from + TimeDelta::minutes(i * step_min))
    };
    let start = utc("2026-03-27T12:00:00Z");
    upsert(&*h.storage, &daily, start).await;
    let mut fired = Vec::new();
    for now in walk("2026-03-27T12:20:00Z", 96, 20) {
        fired.extend(fire(&*h.storage, now).await);
    }
    assert_eq!(
        ticks_of(&fired, "paris-daily"),
        [
            "2026-03-28T01:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-31T00:30:00Z"
        ]
    );
    // Restart the schedule in October (a cadence change restarts; resume does too).
    let pause = |paused: bool, now: &str| SchedulePauseParams {
        name: "paris-daily".into(),
        paused,
        now: Some(utc(now)),
    };
    h.storage
        .schedule_set_paused(&pause(true, "2026-10-23T12:00:00Z"))
        .await
        .unwrap();
    h.storage
        .schedule_set_paused(&pause(false, "2026-10-23T12:00:00Z"))
        .await
        .unwrap();
    upsert(&*h.storage, &hourly, utc("2026-10-24T22:30:00Z")).await;
    let mut fired = Vec::new();
    for now in walk("2026-10-23T12:20:00Z", 96, 20) {
        fired.extend(fire(&*h.storage, now).await);
    }
    assert_eq!(
        ticks_of(&fired, "paris-daily"),
        [
            "2026-10-24T00:30:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-26T01:30:00Z",
            "2026-10-27T01:30:00Z"
        ]
    );
    let hourly_ticks = ticks_of(&fired, "paris-hourly");
    assert_eq!(
        hourly_ticks[..5],
        [
            "2026-10-24T23:00:00Z",
            "2026-10-25T00:00:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T02:00:00Z",
            "2026-10-25T03:00:00Z"
        ],
        "00:00 CEST, 01:00, 02:00 CEST, 02:00 CET, 03:00 CET"
    );
    let hours: BTreeSet<&String> = hourly_ticks.iter().collect();
    assert_eq!(hours.len(), hourly_ticks.len(), "each hour once");
}
