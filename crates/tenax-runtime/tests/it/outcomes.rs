use std::sync::atomic::Ordering;
use std::time::Duration;

use tenax_core::{AttemptOutcome, CompensationState, Registry, TaskKind, TaskStatus};
use tenax_storage::TaskListParams;

use crate::support::{fast, Env, Other, Step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_records_the_result() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::Ok], 5).await;
    let done = env
        .wait_task(&task, "success", |t| t.status == TaskStatus::Succeeded)
        .await;
    assert_eq!(done.result.as_deref(), Some("\"done at attempt 1\""));
    assert_eq!(done.attempt, 1);
    assert!(done.finished_at.is_some());
    worker.shutdown().await;
    env.assert_no_overlap().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_is_dead_after_one_attempt_and_compensated() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::Permanent], 5).await;
    let dead = env
        .wait_task(&task, "compensated", |t| {
            t.compensation == Some(CompensationState::Succeeded)
        })
        .await;
    assert_eq!(dead.status, TaskStatus::Dead);
    assert_eq!(dead.attempt, 1, "a business error is not retried");
    assert_eq!(dead.last_error.as_deref(), Some("invalid id card"));
    assert_eq!(env.seen.executions.load(Ordering::SeqCst), 1);
    assert_eq!(env.seen.compensations.load(Ordering::SeqCst), 1);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_errors_retry_until_the_budget_is_spent() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::Retry], 3).await;
    let dead = env
        .wait_task(&task, "dead and compensated", |t| {
            t.compensation == Some(CompensationState::Succeeded)
        })
        .await;
    assert_eq!(dead.status, TaskStatus::Dead);
    assert_eq!(dead.attempt, 3);
    assert!(dead.last_error.unwrap().contains("no attempts left"));
    let history = env.client.attempts(task.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![
            AttemptOutcome::Failed,
            AttemptOutcome::Failed,
            AttemptOutcome::Dead
        ]
    );
    assert!(history.iter().all(|a| a
        .error
        .as_deref()
        .unwrap_or("")
        .contains("downstream timed out")));
    worker.shutdown().await;
    env.assert_no_overlap().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env
        .enqueue(vec![Step::RetryAfterMs(1500), Step::Ok], 5)
        .await;
    let retrying = env
        .wait_task(&task, "first failure", |t| t.status == TaskStatus::Retrying)
        .await;
    // The next run is scheduled 1.5 s after the failure, on the database clock, instead of
    // the policy's 10 ms backoff.
    let scheduled = retrying.run_at - retrying.updated_at;
    assert_eq!(scheduled, chrono::Duration::milliseconds(1500));
    let done = env
        .wait_task(&task, "success", |t| t.status == TaskStatus::Succeeded)
        .await;
    let history = env.client.attempts(task.id).await.unwrap();
    let gap = history[1].started_at - history[0].finished_at.unwrap();
    assert!(
        gap >= chrono::Duration::milliseconds(1500),
        "second attempt after {gap}"
    );
    assert_eq!(done.attempt, 2);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_is_caught_and_retried() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::Panic, Step::Ok], 5).await;
    let done = env
        .wait_task(&task, "success after panic", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    assert_eq!(done.attempt, 2);
    let history = env.client.attempts(task.id).await.unwrap();
    assert_eq!(history[0].outcome, AttemptOutcome::Failed);
    assert!(history[0]
        .error
        .as_deref()
        .unwrap()
        .contains("handler panicked: handler bug"));
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_counts_as_a_retryable_failure() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env
        .client
        .enqueue::<crate::support::Scripted>(crate::support::Script {
            steps: vec![Step::SleepMs(60_000)],
            compensate_sleep_ms: 0,
        })
        .max_attempts(2)
        .timeout(Duration::from_millis(200))
        .await
        .unwrap()
        .task;
    let dead = env
        .wait_task(&task, "dead after timeouts", |t| {
            t.status == TaskStatus::Dead
        })
        .await;
    assert_eq!(dead.attempt, 2);
    assert!(dead.last_error.unwrap().contains("timed out after 200ms"));
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_payload_is_dead_and_the_worker_keeps_running() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let bad = env
        .client
        .enqueue_raw("SCRIPTED", &serde_json::json!({"steps": "not a list"}))
        .await
        .unwrap()
        .task;
    let dead = env
        .wait_task(&bad, "dead on decode", |t| t.status == TaskStatus::Dead)
        .await;
    assert_eq!(dead.attempt, 1);
    assert!(dead
        .last_error
        .unwrap()
        .contains("payload does not decode as the context of SCRIPTED"));
    // Its compensation cannot decode either: recorded as failed, not retried forever.
    let parent = env
        .wait_task(&bad, "compensation failed", |t| {
            t.compensation == Some(CompensationState::Failed)
        })
        .await;
    assert_eq!(parent.status, TaskStatus::Dead);
    let good = env.enqueue(vec![Step::Ok], 5).await;
    env.wait_task(&good, "a later task succeeds", |t| {
        t.status == TaskStatus::Succeeded
    })
    .await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_no_worker_knows_waits_until_one_does() {
    let env = Env::new().await;
    let old = env.start(env.storage(), env.registry(), fast());
    let unknown = env.client.enqueue::<Other>(()).await.unwrap().task;
    // The old worker is alive and claiming: a task it knows runs ...
    let known = env.enqueue(vec![Step::Ok], 5).await;
    env.wait_task(&known, "known type runs", |t| {
        t.status == TaskStatus::Succeeded
    })
    .await;
    // ... while the unknown type waits, visible in stats.
    assert_eq!(env.get(&unknown).await.status, TaskStatus::Pending);
    let stats = env.client.stats().await.unwrap();
    assert!(stats
        .by_type
        .contains(&("OTHER".to_owned(), TaskStatus::Pending, 1)));
    // A newer worker that knows the type claims it.
    let mut registry = Registry::new();
    registry.register(Other).unwrap();
    let newer = env.start(env.storage(), registry, fast());
    let done = env
        .wait_task(&unknown, "newer worker runs it", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    assert_eq!(done.attempt, 1);
    old.shutdown().await;
    newer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensation_without_an_implementation_is_recorded_as_none() {
    let env = Env::new().await;
    struct Fails;
    impl tenax_core::Command for Fails {
        const TYPE: &'static str = "FAILS";
        type Context = ();
        type Output = ();
        async fn execute(
            &self,
            _: (),
            _: &tenax_core::TaskContext,
        ) -> Result<(), tenax_core::CommandError> {
            Err(tenax_core::CommandError::permanent("no"))
        }
    }
    let mut registry = Registry::new();
    registry.register(Fails).unwrap();
    let worker = env.start(env.storage(), registry, fast());
    let task = env.client.enqueue::<Fails>(()).await.unwrap().task;
    let dead = env
        .wait_task(&task, "compensation recorded", |t| {
            t.compensation == Some(CompensationState::None)
        })
        .await;
    assert_eq!(dead.status, TaskStatus::Dead);
    let all = env
        .client
        .list(&TaskListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let comp = all.iter().find(|t| t.kind == TaskKind::Compensate).unwrap();
    assert_eq!(comp.status, TaskStatus::Succeeded);
    worker.shutdown().await;
}

/// An outcome the database refuses for good (not a transient error) is surfaced, not
/// left unwritten: a refused result is replaced by a note and the task succeeds; a
/// refused error is replaced by a note and the task fails as decided. Neither stays
/// `running` until its lease expires (30 s here, longer than the wait), on the single
/// and the batch path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_database_refuses_is_surfaced_and_never_left_running() {
    use tenax_storage::testing::secrets::{failing, Leak, LeakMany, LEAK, LEAK_MANY};
    use tenax_storage::testing::FaultyStorage;
    let env = Env::new().await;
    let faulty = FaultyStorage::new(env.storage());
    faulty.refuse_outcomes_holding("POISON");
    let mut registry = Registry::new();
    registry.register(Leak).unwrap();
    registry.register_batch(LeakMany).unwrap();
    let shape = serde_json::json!({"note": "POISON"});
    let mut tasks = Vec::new();
    for command_type in [LEAK, LEAK_MANY] {
        for (payload, ends) in [
            (shape.clone(), TaskStatus::Succeeded),
            (failing(&shape), TaskStatus::Dead),
        ] {
            let task = env
                .client
                .enqueue_raw(command_type, &payload)
                .max_attempts(1)
                .await
                .unwrap()
                .task;
            tasks.push((task, ends));
        }
    }
    let config = tenax_runtime::WorkerConfig::fast(Duration::from_secs(30));
    let worker = env.start(faulty, registry, config);
    for (task, ends) in &tasks {
        let done = env
            .wait_task(task, "the task ends before its lease expires", |t| {
                t.status == *ends
            })
            .await;
        let text = done.result.or(done.last_error).unwrap_or_default();
        assert!(
            text.contains("could not be stored") && !text.contains("POISON"),
            "{}: {text}",
            task.command_type
        );
    }
    worker.shutdown().await;
}
