//! `tenax bench drain`: N no-op tasks enqueued first (in bulk), then drained by W
//! worker processes (or W in-process workers) at concurrency C. The rate runs from the
//! first claim to the last completion, both from the database's clock. Each run also
//! drains the same number of tasks with the backend's raw claim+complete baseline, in
//! the same database, so the figure is also a ratio.
use std::time::Duration;

use clap::Args;
use comfy_table::Table;
use tenax::{Client, Registry, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use crate::bank::Noop;
use crate::bench_common::{
    bench_url, drop_bench_schema, progress_bar, spawn_worker, wait_succeeded, BenchDb, Spread,
};

#[derive(Debug, Clone, Args)]
pub(crate) struct DrainArgs {
    /// Tasks to drain in each run.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) tasks: u64,
    /// Worker processes (or in-process workers with --in-process).
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: u32,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: u32,
    /// Run the workers inside this process instead of as `tenax worker` children.
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Concurrent loops of the raw claim+complete baseline (batches of --batch).
    #[arg(long, default_value_t = 1)]
    pub(crate) baseline_clients: u32,
    /// Batch of the raw baseline's claims and completions.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: u32,
    /// Runs; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Longest a run may take.
    #[arg(long, value_parser = crate::parse_duration, default_value = "10m")]
    pub(crate) timeout: Duration,
    /// Keep the bench schema afterwards (PostgreSQL).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// One run's figures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainRun {
    pub(crate) tenax_per_s: f64,
    pub(crate) baseline_per_s: f64,
}

/// Fill the table with `tasks` pending NOOP tasks through `Client::enqueue_many`.
async fn enqueue_bulk(client: &Client, tasks: u64, run: usize) -> anyhow::Result<()> {
    let bar = progress_bar(tasks, "enqueue");
    let mut created = 0u64;
    let mut start = 0u64;
    while start < tasks {
        let end = (start + 5_000).min(tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|i| {
                client
                    .enqueue_raw("NOOP", &serde_json::json!({ "order": i }))
                    .task_no(format!("drain-{run}-{i}"))
            }))
            .await?;
        created += outcomes.iter().filter(|o| o.created()).count() as u64;
        bar.set_position(end);
        start = end;
    }
    bar.finish_and_clear();
    if created != tasks {
        anyhow::bail!("enqueue created {created} of {tasks} tasks");
    }
    Ok(())
}

/// Drain every pending task with Tenax workers; returns tasks per second (database
/// clock, first claim to last completion) of the tasks above `since_id`.
pub(crate) async fn drain_with_workers(
    url: &str,
    client: &Client,
    db: &BenchDb,
    args: &DrainArgs,
    since_id: i64,
    expected: u64,
) -> anyhow::Result<f64> {
    let stop = CancellationToken::new();
    let mut children = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..args.workers.max(1) {
        if args.in_process {
            let mut registry = Registry::new();
            registry.register(Noop)?;
            let config = WorkerConfig {
                concurrency: args.concurrency,
                poll_interval: Duration::from_millis(100),
                ..WorkerConfig::default()
            };
            let worker = Worker::new(client.storage().clone(), registry, config)?;
            handles.push(tokio::spawn(worker.run(stop.clone())));
        } else {
            children.push(spawn_worker(
                url,
                args.concurrency,
                Duration::from_millis(100),
            )?);
        }
    }
    let window = wait_succeeded(db, since_id, expected, args.timeout, "drain").await;
    stop.cancel();
    for handle in handles {
        handle.await??;
    }
    for mut child in children {
        child.kill().await.ok();
    }
    let window = window?;
    if window.other != 0 {
        anyhow::bail!("{} task(s) did not succeed", window.other);
    }
    Ok(window.succeeded as f64 / window.seconds().max(1e-6))
}

/// The raw baseline over the tasks now pending; returns tasks per second.
pub(crate) async fn drain_baseline(
    db: &BenchDb,
    args: &DrainArgs,
    expected: u64,
) -> anyhow::Result<f64> {
    let since_id = 0;
    let done = db.raw_drain(args.baseline_clients, args.batch).await?;
    let window = db.window(since_id).await?;
    if done != expected || window.succeeded != expected {
        anyhow::bail!(
            "the baseline finished {done} (table: {}) of {expected} tasks",
            window.succeeded
        );
    }
    Ok(window.succeeded as f64 / window.seconds().max(1e-6))
}

pub(crate) async fn drain(database_url: &str, args: DrainArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.runs == 0 || args.concurrency == 0 {
        anyhow::bail!("--tasks, --runs and --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let db = BenchDb::connect(&url).await?;
    let mut runs = Vec::new();
    for run in 0..args.runs {
        db.reset().await?;
        enqueue_bulk(&client, args.tasks, run).await?;
        let tenax_per_s = drain_with_workers(&url, &client, &db, &args, 0, args.tasks).await?;
        db.reset().await?;
        db.raw_insert(args.tasks, 10_000, &format!("base-{run}-"), false)
            .await?;
        let baseline_per_s = drain_baseline(&db, &args, args.tasks).await?;
        runs.push(DrainRun {
            tenax_per_s,
            baseline_per_s,
        });
    }
    drop(db);
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;
    report(backend, &args, &runs);
    Ok(())
}

fn report(backend: &str, args: &DrainArgs, runs: &[DrainRun]) {
    let tenax = Spread::of(&runs.iter().map(|r| r.tenax_per_s).collect::<Vec<_>>());
    let base = Spread::of(&runs.iter().map(|r| r.baseline_per_s).collect::<Vec<_>>());
    let ratio = Spread::of(
        &runs
            .iter()
            .map(|r| r.tenax_per_s / r.baseline_per_s)
            .collect::<Vec<_>>(),
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "drain", "backend": backend, "tasks": args.tasks,
                "workers": args.workers, "concurrency": args.concurrency,
                "in_process": args.in_process, "runs": runs.len(),
                "tasks_per_s": tenax, "baseline_per_s": base, "ratio": ratio,
                "baseline_clients": args.baseline_clients, "baseline_batch": args.batch,
                "accounted": args.tasks * runs.len() as u64,
            })
        );
        return;
    }
    let mut table = Table::new();
    table.set_header([
        "backend",
        "what",
        "tasks/s median (min–max)",
        "ratio to baseline",
    ]);
    table.add_row([
        backend.to_owned(),
        format!(
            "tenax: {} worker(s) × {}{}",
            args.workers,
            args.concurrency,
            if args.in_process { " in-process" } else { "" }
        ),
        tenax.show(),
        ratio.show_ratio(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!(
            "raw claim+complete, {} client(s), batches of {}",
            args.baseline_clients, args.batch
        ),
        base.show(),
        "1".to_owned(),
    ]);
    println!(
        "drain of {} no-op tasks, {} run(s):\n{table}",
        args.tasks,
        runs.len()
    );
}
