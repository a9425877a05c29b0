use std::sync::atomic::Ordering;
use std::time::Duration;

use tenax_core::{AttemptOutcome, TaskStatus};
use tenax_runtime::WorkerConfig;
use tenax_storage::testing::{FaultyStorage, StorageMethod};
use tenax_storage::{TaskClaimParams, TaskReapParams, TaskRef};

use crate::support::{fast, wait_for, Env, Step};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_reaped_and_the_task_runs_again() {
    let env = Env::new().await;
    let task = env.enqueue(vec![Step::Ok], 5).await;
    // A worker claims the task and dies without a trace: only its lease remains.
    let claimed = env
        .storage()
        .task_claim_batch(&TaskClaimParams {
            worker: "crashed-worker".into(),
            queues: vec!["default".into()],
            commands: vec![("SCRIPTED".into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_millis(300),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let worker = env.start(
        env.storage(),
        env.registry(),
        WorkerConfig::fast(Duration::from_secs(1)),
    );
    let done = env
        .wait_task(&task, "success after reaping", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    assert_eq!(done.attempt, 2, "the crashed attempt counts");
    let history = env.client.attempts(task.id).await.unwrap();
    assert_eq!(history[0].outcome, AttemptOutcome::LeaseExpired);
    assert_eq!(history[0].worker, "crashed-worker");
    assert_eq!(history[1].outcome, AttemptOutcome::Succeeded);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_fencing_stops_a_handler_whose_lease_cannot_be_renewed() {
    let env = Env::new().await;
    let faulty = FaultyStorage::new(env.storage());
    faulty.fail(StorageMethod::LeaseExtend, true);
    let config = WorkerConfig {
        reaper: false,
        ..WorkerConfig::fast(Duration::from_secs(1))
    };
    let started = tokio::time::Instant::now();
    let worker = env.start(faulty.clone(), env.registry(), config);
    let task = env.enqueue(vec![Step::WaitForCancel], 5).await;
    let seen = env.seen.clone();
    wait_for("the handler is cancelled", || {
        let seen = seen.clone();
        async move { (seen.cancelled.load(Ordering::SeqCst) == 1).then_some(()) }
    })
    .await;
    // Fenced at TTL − margin = 750 ms after the claim, before the lease can expire.
    assert!(started.elapsed() < Duration::from_secs(5));
    let executions = wait_for("the ledger records a fenced end", || {
        let ledger = env.ledger.clone();
        async move {
            let all = ledger.executions().await.unwrap();
            all.iter()
                .any(|e| e.outcome.as_deref() == Some("fenced"))
                .then_some(all)
        }
    })
    .await;
    assert_eq!(executions.len(), 1);
    // The handler stopped before the lease expired in the database (SQLite's clock is
    // this machine's clock, as is the ledger's), so no other worker could have taken
    // the task while it ran.
    let expires = env.get(&task).await.lease_expires_at.expect("still leased");
    let stopped_us = executions[0].end_us.expect("the fenced execution ended");
    assert!(
        stopped_us < expires.timestamp_micros(),
        "stopped at {stopped_us} µs, lease expired at {} µs",
        expires.timestamp_micros()
    );
    // Nothing was written for the fenced attempt: the task is still running under the
    // lost lease until the reaper (switched off here) returns it.
    let current = env.get(&task).await;
    assert_eq!(current.status, TaskStatus::Running);
    assert_eq!(current.attempt, 1);
    assert_eq!(
        env.client.attempts(task.id).await.unwrap()[0].outcome,
        AttemptOutcome::Running
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_handler_and_its_outcome_is_dropped() {
    let env = Env::new().await;
    let worker = env.start(
        env.storage(),
        env.registry(),
        WorkerConfig {
            reaper: false,
            ..fast()
        },
    );
    let task = env.enqueue(vec![Step::WaitForCancel], 5).await;
    env.wait_task(&task, "running", |t| t.status == TaskStatus::Running)
        .await;
    // Another node's reaper judged the lease expired (its clock ran ahead) and another
    // worker claimed the task under the next epoch.
    let storage = env.storage();
    let far = storage.now().await.unwrap() + chrono::Duration::hours(1);
    storage
        .task_reap_expired(&TaskReapParams {
            limit: 10,
            now: Some(far),
            expires_beyond: None,
        })
        .await
        .unwrap();
    let intruder = storage
        .task_claim_batch(&TaskClaimParams {
            worker: "intruder".into(),
            queues: vec!["default".into()],
            commands: vec![("SCRIPTED".into(), 1)],
            limit: 1,
            lease_ttl: Duration::from_secs(3600),
            now: Some(far),
        })
        .await
        .unwrap();
    assert_eq!(intruder.len(), 1);
    let seen = env.seen.clone();
    wait_for("the heartbeat stops the handler", || {
        let seen = seen.clone();
        async move { (seen.cancelled.load(Ordering::SeqCst) == 1).then_some(()) }
    })
    .await;
    worker.shutdown().await;
    let current = env
        .client
        .get(&TaskRef::Id(task.id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.status, TaskStatus::Running);
    assert_eq!(current.lease_owner.as_deref(), Some("intruder"));
    assert_eq!(current.lease_epoch, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_lets_running_tasks_finish() {
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::SleepMs(500)], 5).await;
    env.wait_task(&task, "running", |t| t.status == TaskStatus::Running)
        .await;
    worker.shutdown().await;
    // run() returned only after the running task finished and was recorded.
    assert_eq!(env.get(&task).await.status, TaskStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_running_tasks_are_handed_back() {
    let env = Env::new().await;
    let config = WorkerConfig {
        shutdown_grace: Duration::from_millis(200),
        ..fast()
    };
    let worker = env.start(env.storage(), env.registry(), config);
    // One attempt only: a hand-back must not use it up.
    let task = env.enqueue(vec![Step::SleepMs(800)], 1).await;
    env.wait_task(&task, "running", |t| t.status == TaskStatus::Running)
        .await;
    worker.shutdown().await;
    let handed_back = env.get(&task).await;
    assert_eq!(handed_back.status, TaskStatus::Retrying);
    assert_eq!(
        handed_back.attempt, 0,
        "the interrupted attempt is refunded"
    );
    assert!(handed_back.last_error.unwrap().contains("shut down"));
    // The lease is cleared and the task due at once in the same write: the next worker
    // need not wait for the lease to expire.
    assert_eq!(handed_back.lease_owner, None);
    assert_eq!(handed_back.lease_expires_at, None);
    assert!(handed_back.run_at <= env.client.storage().now().await.unwrap());
    let next = env.start(env.storage(), env.registry(), fast());
    let done = env
        .wait_task(&task, "finished by the next worker", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    assert_eq!(done.attempt, 1);
    next.shutdown().await;
    env.assert_no_overlap().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_two_workers_run_once_each() {
    let env = Env::new().await;
    let a = env.start(env.storage(), env.registry(), fast());
    let b = env.start(env.storage(), env.registry(), fast());
    let mut tasks = Vec::new();
    for _ in 0..100 {
        tasks.push(env.enqueue(vec![Step::Ok], 5).await);
    }
    let storage = env.storage();
    wait_for("all succeeded", || {
        let storage = storage.clone();
        async move { (storage.stats().await.unwrap().count(TaskStatus::Succeeded) == 100).then_some(()) }
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
    let report = env.ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.executions, 100, "each task ran exactly once");
    assert_eq!(env.seen.executions.load(Ordering::SeqCst), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_outcome_write_is_not_a_handler_failure() {
    let env = Env::new().await;
    let faulty = FaultyStorage::new(env.storage());
    faulty.fail(StorageMethod::Complete, true);
    let worker = env.start(faulty.clone(), env.registry(), fast());
    let task = env.enqueue(vec![Step::Ok], 5).await;
    // The handler succeeded, but Tenax cannot write it yet ...
    wait_for("the handler finished", || {
        let ledger = env.ledger.clone();
        async move {
            let all = ledger.executions().await.unwrap();
            all.iter()
                .any(|e| e.outcome.as_deref() == Some("succeeded"))
                .then_some(())
        }
    })
    .await;
    // ... then the database recovers: the success is written, not a failure.
    faulty.fail(StorageMethod::Complete, false);
    let done = env
        .wait_task(&task, "success written", |t| {
            t.status == TaskStatus::Succeeded
        })
        .await;
    assert_eq!(done.attempt, 1);
    let history = env.client.attempts(task.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::Succeeded]
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_running_worker_stops_its_handlers() {
    // A caller that drops `Worker::run` (a select!, a timeout) must not leave handlers
    // running without anything to fence them.
    let env = Env::new().await;
    let worker = env.start(env.storage(), env.registry(), fast());
    let task = env.enqueue(vec![Step::SleepMs(60_000)], 5).await;
    env.wait_task(&task, "running", |t| t.status == TaskStatus::Running)
        .await;
    let seen = env.seen.clone();
    wait_for("the handler starts", || {
        let seen = seen.clone();
        async move { (seen.executions.load(Ordering::SeqCst) == 1).then_some(()) }
    })
    .await;
    worker.handle.abort();
    wait_for("the handler is dropped", || {
        let seen = seen.clone();
        async move { (seen.dropped.load(Ordering::SeqCst) == 1).then_some(()) }
    })
    .await;
}

/// A pool the worker shares with its handlers (a handler running its own queries on
/// the storage's pool), each handler holding a connection for twice the lease.
#[derive(Clone)]
enum SharedPool {
    Pg(tenax_storage::sqlx::PgPool),
    MySql(tenax_storage::sqlx::MySqlPool),
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Hold {
    ms: u64,
}

struct Hog {
    pool: SharedPool,
    fenced: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl tenax_core::Command for Hog {
    const TYPE: &'static str = "HOG";
    type Context = Hold;
    type Output = ();

    async fn execute(
        &self,
        hold: Hold,
        task: &tenax_core::TaskContext,
    ) -> Result<(), tenax_core::CommandError> {
        let held = async {
            let sleep = tokio::time::sleep(Duration::from_millis(hold.ms));
            match &self.pool {
                SharedPool::Pg(pool) => {
                    let _connection = pool.acquire().await;
                    sleep.await;
                }
                SharedPool::MySql(pool) => {
                    let _connection = pool.acquire().await;
                    sleep.await;
                }
            }
        };
        tokio::select! {
            _ = held => Ok(()),
            _ = task.cancellation().cancelled() => {
                self.fenced.fetch_add(1, Ordering::SeqCst);
                Err(tenax_core::CommandError::retryable("fenced"))
            }
        }
    }
}

/// Handlers hold every pooled connection for twice the lease. Lease renewals have a
/// connection of their own, so no heartbeat waits behind them: no handler is fenced,
/// and each task succeeds on its first attempt.
async fn a_pool_held_by_handlers_delays_no_heartbeat(
    pool: SharedPool,
    storage: std::sync::Arc<dyn tenax_storage::Storage>,
) {
    let fenced = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = tenax_core::Registry::new();
    registry
        .register(Hog {
            pool,
            fenced: fenced.clone(),
        })
        .unwrap();
    let config = WorkerConfig {
        concurrency: 2,
        ..WorkerConfig::fast(Duration::from_secs(2))
    };
    let client = tenax_runtime::Client::new(storage.clone());
    let mut tasks = Vec::new();
    for _ in 0..2 {
        tasks.push(
            client
                .enqueue::<Hog>(Hold { ms: 4_000 })
                .await
                .unwrap()
                .task,
        );
    }
    let worker = tenax_runtime::Worker::new(storage, registry, config).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    for task in &tasks {
        let done = wait_for("the task to finish", || {
            let client = client.clone();
            async move {
                client
                    .get(&TaskRef::Id(task.id))
                    .await
                    .unwrap()
                    .filter(|t| t.status.is_finished())
            }
        })
        .await;
        assert_eq!(done.status, TaskStatus::Succeeded, "{done:?}");
        assert_eq!(done.attempt, 1, "one attempt, never fenced nor reaped");
    }
    assert_eq!(fenced.load(Ordering::SeqCst), 0, "a handler was fenced");
    stop.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_held_by_handlers_delays_no_heartbeat_on_postgres() {
    let Some(h) = tenax_storage::testing::postgres_from_env().await else {
        return;
    };
    let config = tenax_storage::postgres::PgConfig {
        max_connections: 2,
        acquire_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let storage = tenax_storage::postgres::PgStorage::connect_with(&h.url, &config)
        .await
        .unwrap();
    let pool = SharedPool::Pg(storage.pool().clone());
    a_pool_held_by_handlers_delays_no_heartbeat(pool, std::sync::Arc::new(storage)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_held_by_handlers_delays_no_heartbeat_on_mariadb() {
    let Some(h) = tenax_storage::testing::mysql_from_env().await else {
        return;
    };
    let config = tenax_storage::mysql::MySqlConfig {
        max_connections: 2,
        acquire_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let storage = tenax_storage::mysql::MySqlStorage::connect_with(&h.url, &config)
        .await
        .unwrap();
    let pool = SharedPool::MySql(storage.pool().clone());
    a_pool_held_by_handlers_delays_no_heartbeat(pool, std::sync::Arc::new(storage)).await;
}
