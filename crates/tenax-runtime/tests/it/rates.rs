use std::time::Duration;

use chrono::TimeDelta;
use tenax_core::{Command, TaskStatus};
use tenax_runtime::{Client, WorkerConfig};
use tenax_storage::{TaskListParams, TaskRef};

use crate::support::{fast, Env, Script, Scripted, Step};

const PER_SECOND: f64 = 20.0;
const BURST: u32 = 5;
const WINDOW_SECS: i64 = 10;
const TASKS: usize = 400;

/// Four workers (separate connection pools, as four nodes), each buffering claimed
/// tasks beyond its running ones, drain a backlog of one type limited to 20/s with a
/// burst of 5. Over 10 s of database time the bucket allows
/// exactly 5 + 20 × 10 = 205 starts: more means the limit leaks, far fewer that the
/// bucket does not refill. Measured on PostgreSQL (`TENAX_TEST_POSTGRES_URL`); skipped
/// without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_buffering_workers_start_a_limited_type_at_its_rate_on_postgres() {
    let Some(harness) = tenax_storage::testing::postgres_from_env().await else {
        eprintln!("TENAX_TEST_POSTGRES_URL is not set: skipped");
        return;
    };
    let env = Env::new().await;
    let client = Client::new(harness.storage.clone());
    client
        .set_rate_limit(Scripted::TYPE, PER_SECOND, BURST)
        .await
        .unwrap();
    for _ in 0..TASKS {
        client
            .enqueue::<Scripted>(Script {
                steps: vec![Step::Ok],
                compensate_sleep_ms: 0,
            })
            .await
            .unwrap();
    }
    let config = WorkerConfig {
        poll_interval: Duration::from_millis(20),
        ..fast()
    };
    let start = harness.storage.now().await.unwrap();
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(env.start(harness.reopen().await, env.registry(), config.clone()));
    }
    // The window is measured on the database clock, from the start timestamps.
    let end = start + TimeDelta::seconds(WINDOW_SECS);
    loop {
        if harness.storage.now().await.unwrap() > end + TimeDelta::milliseconds(200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in workers {
        worker.shutdown().await;
    }
    let tasks = client
        .storage()
        .task_list(&TaskListParams {
            limit: TASKS as u32,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(tasks.len(), TASKS);
    let started: Vec<_> = tasks
        .iter()
        .filter_map(|t| t.started_at)
        .filter(|at| *at >= start && *at <= end)
        .collect();
    let allowed = BURST as usize + (PER_SECOND as usize) * WINDOW_SECS as usize;
    let rate = (started.len() as f64 - f64::from(BURST)) / WINDOW_SECS as f64;
    println!(
        "rate limit {PER_SECOND}/s burst {BURST}: {} starts in {WINDOW_SECS} s \
         (bucket allows {allowed}), {rate:.1}/s after the burst",
        started.len()
    );
    assert!(
        started.len() <= allowed,
        "{} starts, the bucket allows {allowed}",
        started.len()
    );
    assert!(
        started.len() >= allowed * 8 / 10,
        "{} starts, the bucket allows {allowed}: it does not refill",
        started.len()
    );
    // A task that never got a token spent no attempt.
    let waiting = tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Pending)
        .collect::<Vec<_>>();
    assert!(
        !waiting.is_empty(),
        "the backlog drained: the limit did not hold"
    );
    assert!(waiting.iter().all(|t| t.attempt == 0));
    let one = client
        .get(&TaskRef::Id(waiting[0].id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(one.attempt, 0);
}
