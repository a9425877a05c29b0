//! The claim loop's buffer and early-freed slots: buffered tasks are handed back at a
//! graceful stop, a finished handler frees its slot before its outcome commits (within
//! a bound), and cluster-wide limits count buffered tasks as running.
use std::sync::atomic::Ordering;
use std::time::Duration;

use tenax_core::{TaskRecord, TaskStatus};
use tenax_runtime::WorkerConfig;
use tenax_storage::testing::{FaultyStorage, StorageMethod};
use tenax_storage::TaskListParams;

use crate::support::{fast, wait_for, Env, Step};

async fn all_tasks(env: &Env) -> Vec<TaskRecord> {
    env.client
        .list(&TaskListParams {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
}

async fn count(env: &Env, status: TaskStatus) -> usize {
    all_tasks(env)
        .await
        .iter()
        .filter(|t| t.status == status)
        .count()
}

/// Four workers (four connection pools, as four nodes), each with four slots and a
/// buffer of four, run until every task of `tasks` succeeded.
async fn drain_on_four_buffering_workers(env: &Env, tasks: &[TaskRecord]) {
    let config = WorkerConfig {
        concurrency: 4,
        prefetch: Some(4),
        poll_interval: Duration::from_millis(20),
        ..fast()
    };
    let mut workers = Vec::new();
    for _ in 0..4 {
        let storage = tenax_storage::connect(&env.url).await.unwrap();
        workers.push(env.start(storage, env.registry(), config.clone()));
    }
    for task in tasks {
        env.wait_task(task, "every task succeeds", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    }
    for worker in workers {
        worker.shutdown().await;
    }
}

/// One slot, a buffer of four, and handlers that wait to be cancelled: the worker holds
/// five tasks (one running, four buffered). A graceful stop hands every one of them
/// back at once, each with the attempt it was claimed under refunded, so any worker
/// can claim them now rather than after their 30 s leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_back_buffered_tasks_at_once_with_their_attempts_refunded() {
    let env = Env::new().await;
    for _ in 0..8 {
        env.enqueue(vec![Step::WaitForCancel], 5).await;
    }
    let config = WorkerConfig {
        concurrency: 1,
        prefetch: Some(4),
        shutdown_grace: Duration::from_millis(100),
        ..WorkerConfig::fast(Duration::from_secs(30))
    };
    let worker = env.start(env.storage(), env.registry(), config);
    wait_for("one task runs and four are buffered", || async {
        (count(&env, TaskStatus::Running).await == 5
            && env.seen.executions.load(Ordering::SeqCst) == 1)
            .then_some(())
    })
    .await;
    worker.shutdown().await;
    let now = env.storage().now().await.unwrap();
    let tasks = all_tasks(&env).await;
    assert_eq!(
        env.seen.executions.load(Ordering::SeqCst),
        1,
        "a buffered task was started"
    );
    let handed_back = tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Retrying)
        .count();
    assert_eq!(handed_back, 5, "the running task and the four buffered");
    for task in &tasks {
        assert!(
            matches!(task.status, TaskStatus::Pending | TaskStatus::Retrying)
                && task.attempt == 0
                && task.lease_owner.is_none()
                && task.run_at <= now,
            "task {} is claimable at once, its attempt refunded: {task:?}",
            task.id
        );
    }
}

/// Completions fail (transiently) and are retried, so no outcome commits. With one slot
/// and room for two uncommitted outcomes, a handler that returns frees its slot at
/// once: three handlers run, not one. The third keeps its slot, as no place for its
/// outcome is left, and nothing more starts until completions commit again; then every
/// task succeeds once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returned_handler_frees_its_slot_before_its_outcome_commits_up_to_the_bound() {
    let env = Env::new().await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        tasks.push(env.enqueue(vec![Step::Ok], 5).await);
    }
    let faulty = FaultyStorage::new(env.storage());
    faulty.fail(StorageMethod::Complete, true);
    let config = WorkerConfig {
        concurrency: 1,
        complete_batch: 2,
        ..WorkerConfig::fast(Duration::from_secs(20))
    };
    let worker = env.start(faulty.clone(), env.registry(), config);
    wait_for("three handlers ran", || async {
        (env.seen.executions.load(Ordering::SeqCst) >= 3).then_some(())
    })
    .await;
    // The bound holds: a fourth handler would need a slot the third still holds. Watch
    // for a while (a violation shows within a claim's time).
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert_eq!(
            env.seen.executions.load(Ordering::SeqCst),
            3,
            "more handlers ran than one slot and two uncommitted outcomes allow"
        );
    }
    assert_eq!(count(&env, TaskStatus::Succeeded).await, 0);
    faulty.fail(StorageMethod::Complete, false);
    for task in &tasks {
        env.wait_task(task, "every task succeeds", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    }
    worker.shutdown().await;
    assert_eq!(env.seen.executions.load(Ordering::SeqCst), 6);
    env.assert_no_overlap().await;
}

/// Four workers (four connection pools, as four nodes), each with its buffer, drain one
/// queue limited to two running tasks: never more than two handlers run at once,
/// because buffered tasks are claimed tasks and the limit counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_limit_holds_across_four_workers_with_buffers() {
    let env = Env::new().await;
    env.client
        .set_queue_limit("default", Some(2))
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..24 {
        tasks.push(env.enqueue(vec![Step::SleepMs(40)], 5).await);
    }
    drain_on_four_buffering_workers(&env, &tasks).await;
    assert_eq!(env.seen.max_running.load(Ordering::SeqCst), 2);
    env.assert_no_overlap().await;
}

/// The same with a concurrency key: tasks of one key with a limit of one run one at a
/// time across four buffering workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_key_holds_across_four_workers_with_buffers() {
    let env = Env::new().await;
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let task = env
            .client
            .enqueue::<crate::support::Scripted>(crate::support::Script {
                steps: vec![Step::SleepMs(40)],
                compensate_sleep_ms: 0,
            })
            .concurrency_key("account-7")
            .concurrency_limit(1)
            .await
            .unwrap()
            .task;
        tasks.push(task);
    }
    drain_on_four_buffering_workers(&env, &tasks).await;
    assert_eq!(env.seen.max_running.load(Ordering::SeqCst), 1);
    env.assert_no_overlap().await;
}

/// Slow handlers keep the default buffer at one round of handlers: the claim comes
/// back long before a slot frees, so no handler ever finds the buffer empty and the
/// buffer never grows towards `claim_batch`. This is the priority bound the
/// configuration documents: a task enqueued later waits behind at most `concurrency`
/// buffered tasks. Two slots and a buffer of two hold four tasks, plus at most two
/// finished whose outcomes wait for the completer's batch; a buffer that doubled even
/// once would hold more, and one grown to `claim_batch` would hold all thirty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_keep_the_default_buffer_at_one_round_of_handlers() {
    let env = Env::new().await;
    let mut tasks = Vec::new();
    for _ in 0..30 {
        tasks.push(env.enqueue(vec![Step::SleepMs(150)], 5).await);
    }
    let config = WorkerConfig {
        concurrency: 2,
        ..fast()
    };
    assert_eq!(config.prefetch, None, "the default buffer sizes itself");
    assert_eq!(config.prefetch_floor(), 2);
    assert!(
        config.prefetch_size() >= 30,
        "a grown buffer could hold every task"
    );
    let worker = env.start(env.storage(), env.registry(), config);
    let most_held = std::sync::atomic::AtomicUsize::new(0);
    wait_for("every task succeeds", || async {
        let tasks = all_tasks(&env).await;
        let held = tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .count();
        most_held.fetch_max(held, Ordering::SeqCst);
        tasks
            .iter()
            .all(|t| t.status == TaskStatus::Succeeded)
            .then_some(())
    })
    .await;
    worker.shutdown().await;
    let most_held = most_held.load(Ordering::SeqCst);
    assert!(
        most_held >= 2,
        "the worker never ran two tasks at once: {most_held}"
    );
    assert!(
        most_held <= 6,
        "the buffer grew under slow handlers: the worker held {most_held} tasks at once"
    );
    env.assert_no_overlap().await;
}
