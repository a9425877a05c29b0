use std::time::Duration;

use chrono::TimeDelta;
use tenax_core::{MissedTicks, Schedule, TaskStatus};
use tenax_runtime::{Worker, WorkerConfig};
use tenax_storage::{ScheduleUpserted, TaskListParams};

use crate::support::{fast, wait_for, Env, Script, Scripted, Step};

fn script() -> Script {
    Script {
        steps: vec![Step::Ok],
        compensate_sleep_ms: 0,
    }
}

fn every_minute() -> Schedule {
    Schedule::every("minutely", Duration::from_secs(60))
        .missed(MissedTicks::CatchUp(3))
        .command::<Scripted>(script())
}

/// A schedule declared on a worker is stored when it starts (even with its scheduler
/// off); its ticks, fired at an injected time, run on a worker like any task.
#[tokio::test]
async fn a_declared_schedule_is_stored_at_start_and_its_ticks_run() {
    let env = Env::new().await;
    let config = WorkerConfig {
        scheduler: false,
        ..fast()
    };
    let worker = Worker::new(env.storage(), env.registry(), config.clone())
        .unwrap()
        .with_schedule(every_minute())
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let client = env.client.clone();
    let stored = wait_for("the schedule is declared", || {
        let client = client.clone();
        async move { client.schedules().await.unwrap().into_iter().next() }
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(stored.def.name, "minutely");
    assert_eq!(stored.def.command_type, "SCRIPTED");
    let next = stored.next_fire_at.unwrap();

    // Three minutes later (injected): the latest three ticks fire and run.
    let at = next + TimeDelta::minutes(3);
    let fired = env.client.fire_due_schedules(Some(at)).await.unwrap();
    assert_eq!(fired.len(), 3, "{fired:?}");
    assert_eq!(fired[2].tick, at);
    let worker = Worker::new(env.storage(), env.registry(), config).unwrap();
    let ran = worker.drain(Some(at)).await.unwrap();
    assert_eq!(ran.len(), 3);
    let tasks = env
        .client
        .list(&TaskListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(tasks
        .iter()
        .all(|t| t.status == TaskStatus::Succeeded
            && t.task_no.as_str().starts_with("sched:minutely:")));

    // Declaring it again changes nothing, and a paused schedule stays paused.
    env.client.pause_schedule("minutely").await.unwrap();
    let (record, change) = env.client.upsert_schedule(every_minute()).await.unwrap();
    assert_eq!(change, ScheduleUpserted::Unchanged);
    assert!(record.paused);
}

#[tokio::test]
async fn invalid_or_duplicate_schedules_are_refused() {
    let env = Env::new().await;
    let worker = || Worker::new(env.storage(), env.registry(), fast()).unwrap();
    let err = worker()
        .with_schedule(Schedule::cron("bad", "0 99 * * *").command::<Scripted>(script()))
        .unwrap_err();
    assert!(err.to_string().contains("cron"), "{err}");
    let err = worker()
        .with_schedule(every_minute())
        .unwrap()
        .with_schedule(every_minute())
        .unwrap_err();
    assert!(err.to_string().contains("declared twice"), "{err}");
    let err = env
        .client
        .upsert_schedule(Schedule::every("no-command", Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a command"), "{err}");
    assert!(env.client.schedules().await.unwrap().is_empty());
}

/// With the scheduler on (the default), a worker fires a per-second cron by itself.
#[tokio::test]
async fn the_worker_scheduler_fires_due_ticks() {
    let env = Env::new().await;
    let worker = Worker::new(env.storage(), env.registry(), fast())
        .unwrap()
        .with_schedule(Schedule::cron("every-second", "* * * * * *").command::<Scripted>(script()))
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let client = env.client.clone();
    let done = wait_for("a tick's task succeeded", || {
        let client = client.clone();
        async move {
            client
                .list(&TaskListParams {
                    status: Some(TaskStatus::Succeeded),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_iter()
                .next()
        }
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    assert!(
        done.task_no.as_str().starts_with("sched:every-second:"),
        "{}",
        done.task_no
    );
}
