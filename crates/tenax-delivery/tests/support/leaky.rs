//! Tasks whose handlers leak their secret payload fields (in every shape) into their
//! results and errors, run by a real worker configured with those fields; and the
//! check that what a relay published carries none of them.
use std::sync::Arc;
use std::time::Duration;

use tenax_core::{Registry, TaskStatus};
use tenax_runtime::{Client, Worker, WorkerConfig};
use tenax_storage::testing::secrets::{
    failing, leaked, secrets, shapes, Leak, LeakMany, LEAK, LEAK_MANY,
};
use tenax_storage::{Storage, TaskListParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Enqueue every shape, succeeding and failing, single and batched, then run them on
/// a worker with the secret fields configured until each has ended. Returns how many.
pub(crate) async fn run_leaky_tasks(storage: Arc<dyn Storage>) -> usize {
    let client = Client::new(storage.clone());
    let mut count = 0;
    for shape in shapes() {
        for payload in [shape.clone(), failing(&shape)] {
            for command_type in [LEAK, LEAK_MANY] {
                client
                    .enqueue_raw(command_type, &payload)
                    .max_attempts(1)
                    .await
                    .unwrap();
                count += 1;
            }
        }
    }
    let mut registry = Registry::new();
    registry.register(Leak).unwrap();
    registry.register_batch(LeakMany).unwrap();
    let config = WorkerConfig {
        secrets: secrets(),
        poll_interval: Duration::from_millis(20),
        ..WorkerConfig::default()
    };
    let stop = CancellationToken::new();
    let worker = tokio::spawn(
        Worker::new(storage.clone(), registry, config)
            .unwrap()
            .run(stop.clone()),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let tasks = storage
            .task_list(&TaskListParams {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        if tasks
            .iter()
            .all(|t| matches!(t.status, TaskStatus::Succeeded | TaskStatus::Dead))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tasks did not end: {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    worker.await.unwrap().unwrap();
    count
}

/// How many of `bodies` announce a task's end (`succeeded` or `dead`).
pub(crate) fn ends(bodies: &[String]) -> usize {
    bodies
        .iter()
        .filter_map(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .filter(|b| matches!(b["event"].as_str(), Some("succeeded" | "dead")))
        .count()
}

/// No published body holds a secret value, and the ends carry masked texts.
pub(crate) fn assert_masked(bodies: &[String], tasks: usize) {
    assert!(
        ends(bodies) >= tasks,
        "{} ends of {tasks} tasks",
        ends(bodies)
    );
    for body in bodies {
        assert_eq!(
            leaked(body),
            None,
            "a published event holds a secret: {body}"
        );
    }
    let masked = bodies.iter().filter(|b| b.contains("***")).count();
    assert!(
        masked >= tasks,
        "{masked} events carry a masked text, of {tasks} tasks"
    );
}
