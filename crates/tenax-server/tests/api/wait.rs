//! Long-polls: a wait returns as soon as a worker finishes the task, and a timed-out
//! wait returns the unfinished task with `finished: false`.
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use tenax::{Command, CommandError, Registry, TaskContext, Worker, WorkerConfig};
use tenax_storage::testing::Harness;
use tokio_util::sync::CancellationToken;

use crate::on_every_backend;
use crate::support::*;

struct Echo;

impl Command for Echo {
    const TYPE: &'static str = "echo";
    type Context = Value;
    type Output = Value;

    async fn execute(&self, ctx: Value, _task: &TaskContext) -> Result<Value, CommandError> {
        Ok(ctx)
    }
}

async fn a_wait_returns_when_the_worker_finishes_the_task(h: &Harness) {
    let app = app(h.storage.clone(), config());
    let mut registry = Registry::new();
    registry.register(Echo).unwrap();
    let worker = Worker::new(
        h.storage.clone(),
        registry,
        WorkerConfig {
            poll_interval: Duration::from_millis(50),
            ..WorkerConfig::default()
        },
    )
    .unwrap();
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    // Due in 700 ms: the wait is under way before the worker can take it.
    let created = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"echo","payload":{"hello":"world"},"delay_ms":700}"#),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    let id = created.body["id"].as_i64().unwrap();
    let started = Instant::now();
    let answer = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{id}/wait?timeout_ms=30000"),
        Some(ENQUEUER),
        None,
    )
    .await;
    let waited = started.elapsed();
    stop.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    assert_eq!(answer.body["finished"], true);
    assert_eq!(answer.body["task"]["status"], "succeeded");
    assert_eq!(answer.body["task"]["result"], json!({"hello": "world"}));
    assert!(
        waited >= Duration::from_millis(500),
        "returned before the task could run: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "returned long after the task finished: {waited:?}"
    );
}

async fn a_timed_out_wait_returns_the_unfinished_task(h: &Harness) {
    let mut config = config();
    config.wait_max = Duration::from_millis(800);
    let app = app(h.storage.clone(), config);
    // No worker here runs `slow`.
    let created = call(
        &app,
        Method::POST,
        "/v1/tasks",
        Some(ENQUEUER),
        Some(r#"{"command_type":"slow"}"#),
    )
    .await;
    let id = created.body["id"].as_i64().unwrap();
    let started = Instant::now();
    let answer = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{id}/wait?timeout_ms=300"),
        Some(READER),
        None,
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(answer.status, StatusCode::ACCEPTED, "{:?}", answer.body);
    assert_eq!(answer.body["finished"], false);
    assert_eq!(answer.body["task"]["status"], "pending");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    // A longer timeout is capped by wait_max.
    let started = Instant::now();
    let answer = call(
        &app,
        Method::GET,
        &format!("/v1/tasks/{id}/wait?timeout_ms=600000"),
        Some(READER),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Waiting on a task that does not exist is a 404 at once.
    let missing = call(
        &app,
        Method::GET,
        "/v1/tasks/987654321/wait",
        Some(READER),
        None,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

on_every_backend!(
    a_wait_returns_when_the_worker_finishes_the_task,
    a_timed_out_wait_returns_the_unfinished_task,
);

/// On PostgreSQL a long-poll is woken by the finish itself (`NOTIFY`), not by reading
/// the task again and again: ten waiters cost two reads each (before and after they
/// register), and nothing more until the task ends; then all of them answer at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_waits_are_woken_by_the_finish_not_by_polling() {
    let Some(h) = tenax_storage::testing::postgres_from_env().await else {
        return;
    };
    let counted = tenax_storage::testing::FaultyStorage::new(h.storage.clone());
    let app = app(counted.clone(), config());
    let task = h.task(tenax_storage::testing::TaskOpts::default()).await;
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let app = app.clone();
            let path = format!("/v1/tasks/{}/wait?timeout_ms=30000", task.id.0);
            tokio::spawn(async move { call(&app, Method::GET, &path, Some(READER), None).await })
        })
        .collect();
    // Each waiter reads, registers, reads again. Then a quiet stretch, shorter than
    // the recheck (5 s): the reads in it are what waiting costs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counted.task_gets() < 20 {
        assert!(Instant::now() < deadline, "the waiters did not register");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = counted.task_gets();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_reads = counted.task_gets() - before;
    assert!(
        idle_reads <= 5,
        "10 waiters read the task {idle_reads} times in 3 s while it stayed pending"
    );

    let claimed = h.claim("w1", 10, None).await;
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let done = h
        .storage
        .task_complete_if_leased(&tenax_storage::TaskCompleteParams {
            lease: tenax_storage::Lease {
                id: claimed[0].id,
                epoch: claimed[0].lease_epoch,
            },
            result: Some("{}".into()),
            compensation: tenax::CompensationState::None,
            now: None,
        })
        .await
        .unwrap();
    assert!(done);
    let finished = Instant::now();
    for waiter in waiters {
        let answer = waiter.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
        assert_eq!(answer.body["task"]["status"], "succeeded");
    }
    eprintln!(
        "10 waiters: {idle_reads} reads in 3 idle seconds; all answered {:?} after the finish",
        finished.elapsed()
    );
    // The next recheck is at least a second away: only the notification answers
    // this fast.
    assert!(
        finished.elapsed() < Duration::from_millis(900),
        "the waiters answered {:?} after the finish",
        finished.elapsed()
    );
    // Every answered wait removed its row.
    let pg = tenax_storage::postgres::PgStorage::connect(&h.url)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows: i64 = tenax::sqlx::query_scalar("SELECT count(*) FROM tenax_waits")
            .fetch_one(pg.pool())
            .await
            .unwrap();
        if rows == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{rows} wait rows left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
