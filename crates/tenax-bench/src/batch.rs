//! `tenax bench batch`: the same work done by single tasks and by a batch command. N
//! notifications are enqueued first (in bulk), then drained by one in-process worker:
//! once as N tasks of a command that makes one gateway call per task, once as N tasks
//! of a batch command that makes one gateway call per batch of up to 200. A gateway
//! call costs `--call` (a round trip to a remote service; 0 measures Tenax alone). The
//! rate runs from the worker's start until every task of the phase has succeeded; the
//! figure is the ratio of the two rates, the median of the runs.
use std::time::{Duration, Instant};

use clap::Args;
use comfy_table::Table;
use serde::{Deserialize, Serialize};
use tenax::{
    BatchCommand, BatchItem, Batched, Client, Command, CommandError, Registry, TaskContext,
    TaskStatus, Worker, WorkerConfig,
};
use tokio_util::sync::CancellationToken;

use crate::common::{bench_url, drop_bench_schema, progress_bar, Spread};

/// Tasks per batch of the batch command.
const BATCH: u32 = 200;

#[derive(Debug, Clone, Args)]
pub struct BatchArgs {
    /// Notifications in each phase of each run.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) tasks: u64,
    /// Tasks the worker runs at once (single tasks).
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: u32,
    /// Cost of one gateway call, for one task or a whole batch.
    #[arg(long, value_parser = crate::common::parse_duration, default_value = "0s")]
    pub(crate) call: Duration,
    /// Runs; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Longest a phase may take.
    #[arg(long, value_parser = crate::common::parse_duration, default_value = "10m")]
    pub(crate) timeout: Duration,
    /// Keep the bench schema afterwards (PostgreSQL).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Notice {
    to: u64,
}

/// One gateway call per task.
struct NotifyOne {
    call: Duration,
}

impl Command for NotifyOne {
    const TYPE: &'static str = "BENCH_NOTIFY_ONE";
    type Context = Notice;
    type Output = ();

    async fn execute(&self, _: Notice, _: &TaskContext) -> Result<(), CommandError> {
        if !self.call.is_zero() {
            tokio::time::sleep(self.call).await;
        }
        Ok(())
    }
}

/// One gateway call per batch.
struct NotifyMany {
    call: Duration,
}

impl BatchCommand for NotifyMany {
    const TYPE: &'static str = "BENCH_NOTIFY_MANY";
    const MAX_BATCH: u32 = BATCH;
    const MAX_WAIT: Duration = Duration::from_millis(100);
    /// One batch is written while the next runs.
    const CONCURRENCY: u32 = 2;
    type Context = Notice;
    type Output = ();

    async fn execute_batch(&self, items: Vec<BatchItem<Notice>>) -> Vec<Result<(), CommandError>> {
        if !self.call.is_zero() {
            tokio::time::sleep(self.call).await;
        }
        items.iter().map(|_| Ok(())).collect()
    }
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
struct BatchRun {
    single_per_s: f64,
    batch_per_s: f64,
}

async fn succeeded(client: &Client, command_type: &str) -> anyhow::Result<u64> {
    let stats = client.stats().await?;
    Ok(stats
        .by_type
        .iter()
        .filter(|(t, s, _)| t == command_type && *s == TaskStatus::Succeeded)
        .map(|(_, _, n)| n)
        .sum())
}

/// Enqueue `tasks` notifications of `command_type` in bulk.
async fn enqueue(
    client: &Client,
    command_type: &str,
    tasks: u64,
    run: usize,
) -> anyhow::Result<()> {
    let bar = progress_bar(tasks, "enqueue");
    let mut start = 0u64;
    while start < tasks {
        let end = (start + 5_000).min(tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|i| {
                let notice = Notice { to: i };
                let enqueue = if command_type == NotifyOne::TYPE {
                    client.enqueue::<NotifyOne>(notice)
                } else {
                    client.enqueue::<Batched<NotifyMany>>(notice)
                };
                enqueue.task_no(format!("{command_type}-{run}-{i}"))
            }))
            .await?;
        let created = outcomes.iter().filter(|o| o.created()).count() as u64;
        if created != end - start {
            anyhow::bail!("enqueue created {created} of {} tasks", end - start);
        }
        bar.set_position(end);
        start = end;
    }
    bar.finish_and_clear();
    Ok(())
}

/// Run a worker with `registry` until `tasks` more tasks of `command_type` have
/// succeeded; returns tasks per second.
async fn drain(
    client: &Client,
    registry: Registry,
    command_type: &str,
    args: &BatchArgs,
) -> anyhow::Result<f64> {
    let before = succeeded(client, command_type).await?;
    let config = WorkerConfig {
        concurrency: args.concurrency,
        poll_interval: Duration::from_millis(100),
        ..WorkerConfig::default()
    };
    let worker = Worker::new(client.storage().clone(), registry, config)?;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let handle = tokio::spawn(worker.run(stop.clone()));
    let bar = progress_bar(args.tasks, command_type);
    let outcome = loop {
        let done = succeeded(client, command_type)
            .await?
            .saturating_sub(before);
        bar.set_position(done);
        if done >= args.tasks {
            break Ok(done as f64 / started.elapsed().as_secs_f64().max(1e-6));
        }
        if started.elapsed() > args.timeout {
            break Err(anyhow::anyhow!(
                "only {done} of {} tasks succeeded within {:?}",
                args.tasks,
                args.timeout
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    bar.finish_and_clear();
    stop.cancel();
    handle.await??;
    outcome
}

pub(crate) async fn batch(database_url: &str, args: BatchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.runs == 0 || args.concurrency == 0 {
        anyhow::bail!("--tasks, --runs and --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let mut runs = Vec::new();
    for run in 0..args.runs {
        enqueue(&client, NotifyOne::TYPE, args.tasks, run).await?;
        let mut singles = Registry::new();
        singles.register(NotifyOne { call: args.call })?;
        let single_per_s = drain(&client, singles, NotifyOne::TYPE, &args).await?;

        enqueue(&client, NotifyMany::TYPE, args.tasks, run).await?;
        let mut batches = Registry::new();
        batches.register_batch(NotifyMany { call: args.call })?;
        let batch_per_s = drain(&client, batches, NotifyMany::TYPE, &args).await?;
        runs.push(BatchRun {
            single_per_s,
            batch_per_s,
        });
    }
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;
    report(backend, &args, &runs);
    Ok(())
}

fn report(backend: &str, args: &BatchArgs, runs: &[BatchRun]) {
    let single = Spread::of(&runs.iter().map(|r| r.single_per_s).collect::<Vec<_>>());
    let batch = Spread::of(&runs.iter().map(|r| r.batch_per_s).collect::<Vec<_>>());
    let ratio = Spread::of(
        &runs
            .iter()
            .map(|r| r.batch_per_s / r.single_per_s)
            .collect::<Vec<_>>(),
    );
    let call_ms = args.call.as_secs_f64() * 1000.0;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "batch", "backend": backend, "tasks": args.tasks,
                "concurrency": args.concurrency, "batch": BATCH, "call_ms": call_ms,
                "runs": runs.len(), "single_per_s": single, "batch_per_s": batch,
                "ratio": ratio,
            })
        );
        return;
    }
    let mut table = Table::new();
    table.set_header([
        "backend",
        "what",
        "tasks/s median (min–max)",
        "ratio to single tasks",
    ]);
    table.add_row([
        backend.to_owned(),
        format!("single tasks, concurrency {}", args.concurrency),
        single.show(),
        "1".to_owned(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!("batch command, batches of {BATCH}"),
        batch.show(),
        ratio.show_ratio(),
    ]);
    println!(
        "{} notifications per phase, gateway call {call_ms} ms, {} run(s):\n{table}",
        args.tasks,
        runs.len()
    );
}
