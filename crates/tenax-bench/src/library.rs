//! The `--in-process` modes of `tenax bench drain` and `tenax bench latency`: Tenax
//! measured as a new user runs it, through the public library API alone. The bench
//! process enqueues with `Client`, runs one library `Worker` with
//! `WorkerConfig::default()` except its concurrency, and a no-op command whose handler
//! reports to the bench: which tasks ran (a drain ends when every handler ran and
//! `Client::stats` shows every task succeeded) and when each handler started (the
//! latency, from just before the enqueue call, on the monotonic clock).
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tenax::{
    Client, Command, CommandError, Registry, TaskContext, TaskId, TaskStatus, Worker, WorkerConfig,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::{progress_bar, BenchDb};

/// Which of a drain's tasks ran, by the order number in their payload.
struct Tally {
    ran: Vec<AtomicBool>,
    distinct: AtomicU64,
    repeats: AtomicU64,
    all_ran: tokio::sync::Notify,
}

impl Tally {
    fn new(tasks: u64) -> Arc<Self> {
        Arc::new(Self {
            ran: (0..tasks).map(|_| AtomicBool::new(false)).collect(),
            distinct: AtomicU64::new(0),
            repeats: AtomicU64::new(0),
            all_ran: tokio::sync::Notify::new(),
        })
    }

    fn total(&self) -> u64 {
        self.ran.len() as u64
    }

    fn distinct(&self) -> u64 {
        self.distinct.load(Ordering::Acquire)
    }

    /// Wait until every task's handler ran; fails at `deadline`.
    async fn wait_all(&self, deadline: Instant) -> anyhow::Result<()> {
        while self.distinct() < self.total() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                anyhow::bail!(
                    "the handler ran for only {} of {} tasks in time",
                    self.distinct(),
                    self.total()
                );
            }
            // Bounded, so that a notification that came between the count and the
            // wait costs at most this much.
            let _ =
                tokio::time::timeout(left.min(Duration::from_millis(50)), self.all_ran.notified())
                    .await;
        }
        Ok(())
    }
}

/// The payload of a drain's no-op task.
#[derive(Serialize, Deserialize)]
pub(crate) struct Order {
    order: u64,
}

/// The drain's no-op command: marks its task as run, nothing else.
#[derive(Clone)]
struct TalliedNoop(Arc<Tally>);

impl Command for TalliedNoop {
    const TYPE: &'static str = "NOOP";
    type Context = Order;
    type Output = ();

    async fn execute(&self, ctx: Order, _task: &TaskContext) -> Result<(), CommandError> {
        let tally = &self.0;
        let Some(flag) = usize::try_from(ctx.order)
            .ok()
            .and_then(|i| tally.ran.get(i))
        else {
            return Err(CommandError::permanent(format!(
                "order {} is not one of this run's",
                ctx.order
            )));
        };
        if flag.swap(true, Ordering::AcqRel) {
            tally.repeats.fetch_add(1, Ordering::Relaxed);
        } else if tally.distinct.fetch_add(1, Ordering::AcqRel) + 1 == tally.total() {
            tally.all_ran.notify_one();
        }
        Ok(())
    }
}

/// The library workers a run starts: `WorkerConfig::default()` but these.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fleet {
    pub(crate) workers: u32,
    pub(crate) concurrency: u32,
    /// `WorkerConfig::prefetch`: `None` keeps the default (the buffer follows the
    /// handlers' pace).
    pub(crate) prefetch: Option<u32>,
}

/// Start the fleet's library workers.
fn start_workers<C: Command + Clone>(
    client: &Client,
    command: C,
    fleet: Fleet,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<JoinHandle<Result<(), tenax::Error>>>> {
    let mut handles = Vec::new();
    for _ in 0..fleet.workers.max(1) {
        let mut registry = Registry::new();
        registry.register(command.clone())?;
        let config = WorkerConfig {
            concurrency: fleet.concurrency,
            prefetch: fleet.prefetch,
            ..WorkerConfig::default()
        };
        let worker = Worker::new(client.storage().clone(), registry, config)?;
        handles.push(tokio::spawn(worker.run(stop.clone())));
    }
    Ok(handles)
}

/// Stop the workers and wait for them; a worker's error is the run's.
async fn stop_workers(
    stop: &CancellationToken,
    handles: Vec<JoinHandle<Result<(), tenax::Error>>>,
) -> anyhow::Result<()> {
    stop.cancel();
    for handle in handles {
        handle.await.context("a worker panicked")??;
    }
    Ok(())
}

/// How many tasks stand in each status.
async fn status_counts(client: &Client) -> anyhow::Result<(u64, u64)> {
    let stats = client.stats().await?;
    let succeeded = stats.count(TaskStatus::Succeeded);
    let all: u64 = stats.by_status.iter().map(|(_, n)| n).sum();
    Ok((succeeded, all - succeeded))
}

/// One in-process drain's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LibraryDrain {
    /// From the workers' start until every handler ran and the stats show every task
    /// succeeded (this process's clock).
    pub(crate) per_s: f64,
    /// First claim to last completion (the database's clock), as the other drains.
    pub(crate) db_clock_per_s: f64,
    /// `Client::enqueue_many` before the drain.
    pub(crate) enqueue_per_s: f64,
    /// Handlers that ran again for a task that had run (none expected).
    pub(crate) repeats: u64,
}

/// Enqueue `tasks` no-op tasks with `Client::enqueue_many` in batches of `batch`, then
/// drain them with library workers in this process. The table must hold no other task.
pub(crate) async fn drain_in_process(
    client: &Client,
    db: &BenchDb,
    tasks: u64,
    batch: u64,
    fleet: Fleet,
    timeout: Duration,
) -> anyhow::Result<LibraryDrain> {
    let tally = Tally::new(tasks);
    let bar = progress_bar(tasks, "enqueue");
    let enqueued = Instant::now();
    let mut created = 0u64;
    let mut start = 0u64;
    while start < tasks {
        let end = (start + batch.max(1)).min(tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|order| client.enqueue::<TalliedNoop>(Order { order })))
            .await?;
        created += outcomes.iter().filter(|o| o.created()).count() as u64;
        bar.set_position(end);
        start = end;
    }
    let enqueue_per_s = tasks as f64 / enqueued.elapsed().as_secs_f64().max(1e-6);
    bar.finish_and_clear();
    if created != tasks {
        anyhow::bail!("enqueue created {created} of {tasks} tasks");
    }

    let stop = CancellationToken::new();
    let started = Instant::now();
    let deadline = started + timeout;
    let handles = start_workers(client, TalliedNoop(tally.clone()), fleet, &stop)?;
    let bar = progress_bar(tasks, "drain");
    let watch = {
        let (tally, bar) = (tally.clone(), bar.clone());
        tokio::spawn(async move {
            loop {
                bar.set_position(tally.distinct());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let finished = async {
        tally.wait_all(deadline).await?;
        // The last completions commit after their handlers return.
        loop {
            let (succeeded, _) = status_counts(client).await?;
            if succeeded >= tasks {
                return anyhow::Ok(started.elapsed());
            }
            if Instant::now() > deadline {
                anyhow::bail!("only {succeeded} of {tasks} tasks succeeded in time");
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    .await;
    watch.abort();
    bar.finish_and_clear();
    let stopped = stop_workers(&stop, handles).await;
    let elapsed = finished?;
    stopped?;

    let (succeeded, other) = status_counts(client).await?;
    if succeeded != tasks || other != 0 || tally.distinct() != tasks {
        anyhow::bail!(
            "{succeeded} of {tasks} tasks succeeded, {other} stand in another status, the \
             handler ran for {}",
            tally.distinct()
        );
    }
    let window = db.window(0).await?;
    Ok(LibraryDrain {
        per_s: tasks as f64 / elapsed.as_secs_f64().max(1e-6),
        db_clock_per_s: window.succeeded as f64 / window.seconds().max(1e-6),
        enqueue_per_s,
        repeats: tally.repeats.load(Ordering::Relaxed),
    })
}

/// When each task's handler started, by task id (the first start only).
#[derive(Default)]
struct Starts {
    at: Mutex<HashMap<TaskId, Instant>>,
}

/// The latency bench's no-op command: notes when its handler started.
#[derive(Clone)]
struct StampedNoop(Arc<Starts>);

impl Command for StampedNoop {
    const TYPE: &'static str = "NOOP";
    type Context = serde_json::Value;
    type Output = ();

    async fn execute(
        &self,
        _ctx: serde_json::Value,
        task: &TaskContext,
    ) -> Result<(), CommandError> {
        let now = Instant::now();
        if let Ok(mut at) = self.0.at.lock() {
            at.entry(task.id()).or_insert(now);
        }
        Ok(())
    }
}

impl Starts {
    fn get(&self, id: TaskId) -> Option<Instant> {
        self.at.lock().ok().and_then(|at| at.get(&id).copied())
    }
}

/// The tasks of an in-process latency run, with the instant just before each one's
/// enqueue call and its handler's start.
pub(crate) struct Stamped {
    pub(crate) ids: Vec<TaskId>,
    /// Enqueue call to handler start, milliseconds, in enqueue order.
    pub(crate) call_to_start_ms: Vec<f64>,
    pub(crate) enqueue_seconds: f64,
}

/// One library worker at `concurrency` idle in this process; `tasks` single enqueues at
/// `rate` per second (open loop: each at its tick, whether or not the previous ones
/// ran); every handler start against the instant just before its enqueue call.
pub(crate) async fn latency_in_process(
    client: &Client,
    tasks: usize,
    rate: u32,
    concurrency: u32,
) -> anyhow::Result<Stamped> {
    let starts = Arc::new(Starts::default());
    let stop = CancellationToken::new();
    let fleet = Fleet {
        workers: 1,
        concurrency,
        prefetch: None,
    };
    let handles = start_workers(client, StampedNoop(starts.clone()), fleet, &stop)?;
    let measured = async {
        // Warm up: the worker is ready, and idle again, once it has run one task.
        let warm = client
            .enqueue::<StampedNoop>(serde_json::json!({}))
            .await?
            .task;
        crate::common::wait_finished(client, &[warm.id], Duration::from_secs(30)).await?;

        let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent = Vec::with_capacity(tasks);
        let began = Instant::now();
        for _ in 0..tasks {
            ticker.tick().await;
            let before = Instant::now();
            let id = client
                .enqueue::<StampedNoop>(serde_json::json!({}))
                .await?
                .task
                .id;
            sent.push((id, before));
        }
        let enqueue_seconds = began.elapsed().as_secs_f64();
        let ids: Vec<TaskId> = sent.iter().map(|(id, _)| *id).collect();
        crate::common::wait_finished(client, &ids, Duration::from_secs(60)).await?;
        anyhow::Ok((sent, enqueue_seconds))
    }
    .await;
    let stopped = stop_workers(&stop, handles).await;
    let (sent, enqueue_seconds) = measured?;
    stopped?;
    let mut call_to_start_ms = Vec::with_capacity(sent.len());
    for (id, before) in &sent {
        let start = starts
            .get(*id)
            .with_context(|| format!("task {id} succeeded but its handler never started"))?;
        call_to_start_ms.push(start.saturating_duration_since(*before).as_secs_f64() * 1000.0);
    }
    Ok(Stamped {
        ids: sent.iter().map(|(id, _)| *id).collect(),
        call_to_start_ms,
        enqueue_seconds,
    })
}
