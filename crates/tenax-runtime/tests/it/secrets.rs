//! Secret payload fields never reach a stored outcome: the worker masks the result's
//! secret fields and every literal copy of a secret value in the result and the error
//! before writing them, on the single and the batch path, so nothing read from the
//! database afterwards (answers, events, callbacks, alerts) can carry them.
use tenax_core::{Registry, TaskStatus};
use tenax_runtime::WorkerConfig;
use tenax_storage::testing::secrets::{
    failing, leaked, secrets, shapes, Leak, LeakMany, CARD, LEAK, LEAK_MANY,
};

use crate::support::{fast, Env};

fn registry() -> Registry {
    let mut registry = Registry::new();
    registry.register(Leak).unwrap();
    registry.register_batch(LeakMany).unwrap();
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_values_are_masked_out_of_every_stored_result_and_error() {
    let env = Env::new().await;
    let mut tasks = Vec::new();
    for shape in shapes() {
        for payload in [shape.clone(), failing(&shape)] {
            for command_type in [LEAK, LEAK_MANY] {
                let task = env
                    .client
                    .enqueue_raw(command_type, &payload)
                    .max_attempts(1)
                    .await
                    .unwrap()
                    .task;
                tasks.push(task);
            }
        }
    }
    let config = WorkerConfig {
        secrets: secrets(),
        ..fast()
    };
    let worker = env.start(env.storage(), registry(), config);
    for task in &tasks {
        let fails = task.payload.contains("\"fail\":true");
        let want = if fails {
            TaskStatus::Dead
        } else {
            TaskStatus::Succeeded
        };
        let done = env
            .wait_task(task, "every task ends", |t| t.status == want)
            .await;
        let result = done.result.clone().unwrap_or_default();
        let error = done.last_error.clone().unwrap_or_default();
        let history = format!("{:?}", env.client.attempts(task.id).await.unwrap());
        for (what, text) in [
            ("result", &result),
            ("error", &error),
            ("attempts", &history),
        ] {
            assert_eq!(
                leaked(text),
                None,
                "{} {}: the {what} holds a secret: {text}",
                task.command_type,
                task.payload
            );
        }
        let kept = if fails { &error } else { &result };
        assert!(kept.contains("***"), "masked, not emptied: {kept}");
    }
    // The payload itself is stored whole: the handler needs it.
    assert!(env.get(&tasks[0]).await.payload.contains(CARD));
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_secrets_the_outcome_is_stored_as_returned() {
    let env = Env::new().await;
    let task = env
        .client
        .enqueue_raw(LEAK, &shapes()[0])
        .await
        .unwrap()
        .task;
    let worker = env.start(env.storage(), registry(), fast());
    let done = env
        .wait_task(&task, "it succeeds", |t| t.status == TaskStatus::Succeeded)
        .await;
    assert_eq!(leaked(&done.result.unwrap_or_default()), Some(CARD));
    worker.shutdown().await;
}
