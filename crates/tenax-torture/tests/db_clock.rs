//! The database server's clock steps while workers run: an hour forward, an hour back,
//! then ten minutes forward, on a private PostgreSQL and a private MariaDB under
//! libfaketime (their own ports and data directories; the shared servers are never
//! touched).
//!
//! Leases and the reaper use the database clock. A step forward makes every lease look
//! expired at once; a step back makes a dead worker's leases look an hour longer. What
//! these tests hold the reaper to:
//! - no execution of a task overlaps another execution of the same task, across every
//!   step, and every task runs exactly once;
//! - the tasks a worker held when it died, just before the clock stepped back, start
//!   again within a lease TTL of the step, plus two reaper passes and a slack.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tenax::storage::{Storage, TaskClaimParams, TaskRef};
use tenax::{Client, Command, CommandError, Registry, TaskContext, TaskId, TaskStatus, Worker};
use tenax::{TaskRecord, WorkerConfig};
use tenax_torture::db_clock::DbClock;
use tenax_torture::private_mariadb::PrivateMariadb;
use tenax_torture::private_pg::PrivatePostgres;
use tenax_torture::required;
use tokio_util::sync::CancellationToken;

/// The lease of every worker here.
const TTL: Duration = Duration::from_secs(6);
/// Heartbeats far apart and reaper passes close together: after a step forward, a
/// reaper pass almost always comes before the leases are renewed, so a reaper that
/// trusted the stepped clock would take them from their running handlers.
const HEARTBEAT: Duration = Duration::from_secs(2);
const REAPER: Duration = Duration::from_millis(250);

/// One execution: its task, and when its handler started and ended (this process's
/// monotonic clock, which no step moves).
#[derive(Debug, Clone, Copy)]
struct Run {
    task: TaskId,
    started: Instant,
    ended: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
struct Log(Arc<Mutex<Vec<Run>>>);

impl Log {
    fn runs(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }

    fn runs_of(&self, task: TaskId) -> Vec<Run> {
        self.runs().into_iter().filter(|r| r.task == task).collect()
    }
}

/// Ends a run when the handler returns or is dropped (a fenced handler is dropped).
struct Ending {
    log: Log,
    index: usize,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Ok(mut runs) = self.log.0.lock() {
            runs[self.index].ended = Some(Instant::now());
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Sleep {
    ms: u64,
}

struct Slow {
    log: Log,
}

impl Command for Slow {
    const TYPE: &'static str = "SLOW";
    type Context = Sleep;
    type Output = ();

    async fn execute(&self, sleep: Sleep, task: &TaskContext) -> Result<(), CommandError> {
        let index = {
            let mut runs = self.log.0.lock().unwrap();
            runs.push(Run {
                task: task.id(),
                started: Instant::now(),
                ended: None,
            });
            runs.len() - 1
        };
        let _ending = Ending {
            log: self.log.clone(),
            index,
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep.ms)) => Ok(()),
            _ = task.cancellation().cancelled() => Err(CommandError::retryable("cancelled")),
        }
    }
}

async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn enqueue(client: &Client, n: usize, ms: u64, delay: Option<Duration>) -> Vec<TaskRecord> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut enqueue = client.enqueue::<Slow>(Sleep { ms });
        if let Some(delay) = delay {
            enqueue = enqueue.run_in(delay);
        }
        tasks.push(enqueue.await.unwrap().task);
    }
    tasks
}

async fn all_succeeded(client: &Client, tasks: &[TaskRecord], within: Duration) {
    wait_for("every task to succeed", within, || async {
        for task in tasks {
            let now = client.get(&TaskRef::Id(task.id)).await.ok()??;
            if now.status != TaskStatus::Succeeded {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Moves the server's clock to `offset` and waits until the server reads it.
async fn step(storage: &Arc<dyn Storage>, clock: &DbClock, offset: &str, ahead: chrono::TimeDelta) {
    clock.set(offset).unwrap();
    wait_for(
        &format!("the database clock at {offset}"),
        Duration::from_secs(10),
        || async {
            let db = storage.now().await.ok()?;
            let off = db - chrono::Utc::now();
            ((off - ahead).num_seconds().abs() < 5).then_some(())
        },
    )
    .await;
}

/// Phase: 30 tasks of 3 s all running on the two workers, then the clock steps to
/// `offset`; every task ends succeeded.
async fn step_while_running(
    client: &Client,
    log: &Log,
    clock: &DbClock,
    offset: &str,
    ahead: chrono::TimeDelta,
) -> Vec<TaskRecord> {
    let tasks = enqueue(client, 30, 3_000, None).await;
    wait_for("every task to start", Duration::from_secs(30), || async {
        let started = tasks
            .iter()
            .filter(|t| !log.runs_of(t.id).is_empty())
            .count();
        (started == tasks.len()).then_some(())
    })
    .await;
    step(client.storage(), clock, offset, ahead).await;
    all_succeeded(client, &tasks, Duration::from_secs(60)).await;
    ran_once(log, &tasks);
    tasks
}

/// Every task of `tasks` ran exactly once: nothing ran twice, so nothing ran twice at
/// once.
fn ran_once(log: &Log, tasks: &[TaskRecord]) {
    for task in tasks {
        let runs = log.runs_of(task.id);
        assert_eq!(
            runs.len(),
            1,
            "task {} ran {} times: {runs:?}",
            task.id,
            runs.len()
        );
        assert!(runs[0].ended.is_some());
    }
}

async fn steps_of_the_database_clock(url: &str, clock: &DbClock) {
    let storage = tenax::storage::connect(url).await.unwrap();
    let client = Client::new(storage.clone());
    let log = Log::default();
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..2 {
        // Each worker with its own pool and its own reaper.
        let storage = tenax::storage::connect(url).await.unwrap();
        let mut registry = Registry::new();
        registry.register(Slow { log: log.clone() }).unwrap();
        let config = WorkerConfig {
            concurrency: 20,
            heartbeat_interval: HEARTBEAT,
            fence_margin: Duration::from_millis(1500),
            reaper_interval: REAPER,
            scheduler: false,
            pruner: false,
            ..WorkerConfig::fast(TTL)
        };
        let worker = Worker::new(storage, registry, config).unwrap();
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }
    // A reaper watches the clock for a TTL before its first reaping (a step may have
    // come just before it started); the steps below come after that, so that it is the
    // watch on a running reaper that they test.
    tokio::time::sleep(TTL + REAPER * 2).await;
    let hour = chrono::TimeDelta::hours(1);

    // An hour forward while 30 tasks run: every lease looks expired at once.
    let mut tasks = step_while_running(&client, &log, clock, "+1h", hour).await;

    // A worker claims 5 tasks and dies; then the clock steps back an hour, and its
    // leases look an hour longer. (The dead worker claims as of a minute ahead, so that
    // the tasks, due in one, are its and not the live workers': on a loaded machine the
    // enqueues and the claim may be seconds apart.)
    let held = enqueue(&client, 5, 100, Some(Duration::from_secs(60))).await;
    let ahead = storage.now().await.unwrap() + chrono::TimeDelta::seconds(61);
    let claimed = storage
        .task_claim_batch(&TaskClaimParams {
            worker: "dead-worker".into(),
            queues: vec!["default".into()],
            commands: vec![("SLOW".into(), 1)],
            limit: 5,
            lease_ttl: TTL,
            now: Some(ahead),
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 5, "the dead worker holds the 5 tasks");
    step(&storage, clock, "+0", chrono::TimeDelta::zero()).await;
    let stepped = Instant::now();
    all_succeeded(&client, &held, Duration::from_secs(60)).await;
    // Seen on the reaper's next pass, reaped a TTL later by the pass after that.
    let bound = TTL + REAPER.mul_f64(1.2) * 2 + Duration::from_millis(1500);
    for task in &held {
        let runs = log.runs_of(task.id);
        let since = runs[0].started.saturating_duration_since(stepped);
        assert!(
            since <= bound,
            "task {} started again {since:?} after the step back (bound {bound:?})",
            task.id
        );
    }
    tasks.extend(held);

    // Ten minutes forward while 30 tasks run.
    tasks.extend(
        step_while_running(&client, &log, clock, "+10m", chrono::TimeDelta::minutes(10)).await,
    );

    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    // The dead worker never ran its 5: every execution is one of the tasks' only ones.
    ran_once(&log, &tasks);
    assert_eq!(log.runs().len(), tasks.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_of_the_database_clock_run_nothing_twice_on_postgres() {
    if !required(
        tenax_torture::private_pg::find_bindir().is_some(),
        "no PostgreSQL server binaries for a private instance",
    ) || !required(
        tenax_torture::fleet::libfaketime().is_some(),
        "libfaketime is not installed (apt-get install faketime)",
    ) {
        return;
    }
    let clock = DbClock::new().unwrap();
    let pg = tokio::task::block_in_place(|| PrivatePostgres::start_with_clock(&clock)).unwrap();
    steps_of_the_database_clock(&pg.url(), &clock).await;
}

/// A clock and a private MariaDB under it; `None` (after saying why) where the server
/// binaries or libfaketime are missing and not required.
fn stepped_mariadb() -> Option<(DbClock, PrivateMariadb)> {
    if !required(
        tenax_torture::private_mariadb::available(),
        "no MariaDB server binaries for a private instance",
    ) || !required(
        tenax_torture::fleet::libfaketime().is_some(),
        "libfaketime is not installed (apt-get install faketime)",
    ) {
        return None;
    }
    let clock = DbClock::new().unwrap();
    let db = tokio::task::block_in_place(|| PrivateMariadb::start_with_clock(&clock)).unwrap();
    Some((clock, db))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_of_the_database_clock_run_nothing_twice_on_mariadb() {
    let Some((clock, db)) = stepped_mariadb() else {
        return;
    };
    steps_of_the_database_clock(&db.url(), &clock).await;
}

/// The harness's own clock: after each step, every connection of a threaded server
/// reads the stepped time, at every statement. (The plain libfaketime build, re-reading
/// its offset at each call, answered the real time now and then to one of MariaDB's
/// threads: a claim then granted a lease already expired by the stepped clock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_of_a_stepped_mariadb_reads_the_stepped_clock() {
    let Some((clock, db)) = stepped_mariadb() else {
        return;
    };
    let storage = tenax::storage::connect(&db.url()).await.unwrap();
    let mut reads = 0usize;
    let mut wrong = Vec::new();
    for (offset, secs) in [("+10m", 600i64), ("+0", 0), ("+1h", 3600), ("+0", 0)] {
        step(&storage, &clock, offset, chrono::TimeDelta::seconds(secs)).await;
        let until = Instant::now() + Duration::from_millis(1500);
        let mut readers = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let storage = storage.clone();
            readers.spawn(async move {
                let mut seen = Vec::new();
                while Instant::now() < until {
                    let db = storage.now().await.unwrap();
                    seen.push((db - chrono::Utc::now()).num_milliseconds());
                }
                seen
            });
        }
        while let Some(seen) = readers.join_next().await {
            for off in seen.unwrap() {
                reads += 1;
                if (off - secs * 1000).abs() > 2000 {
                    wrong.push((offset, off));
                }
            }
        }
    }
    assert!(reads > 1000, "only {reads} reads");
    assert!(
        wrong.is_empty(),
        "{} of {reads} reads were off the stepped clock (step, ms ahead of real time): {wrong:?}",
        wrong.len()
    );
}
