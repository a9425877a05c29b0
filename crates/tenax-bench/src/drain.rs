//! `tenax bench drain`: N no-op tasks enqueued first (in bulk), then drained by W
//! worker processes at concurrency C, for each C of a list. The rate runs from the
//! first claim to the last completion, both from the database's clock. With
//! `--in-process`, the bench is a user of the library instead (`library.rs`):
//! it enqueues, runs the workers and times the drain itself. Each run also drains the
//! same number of tasks with the backend's raw claim+complete baseline, in the same
//! database, so the figure is also a ratio.
use std::time::Duration;

use clap::Args;
use comfy_table::Table;
use tenax::{Client, Registry, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use crate::common::{
    bench_url, drop_bench_schema, progress_bar, spawn_worker, wait_succeeded, BenchDb, Noop, Spread,
};
use crate::library::{drain_in_process, Fleet, LibraryDrain};

#[derive(Debug, Clone, Args)]
pub struct DrainArgs {
    /// Tasks to drain in each run.
    #[arg(long, default_value_t = 20_000)]
    pub(crate) tasks: u64,
    /// Worker processes (or library workers in this process with --in-process).
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: u32,
    /// Tasks each worker runs at once: one figure for each value of the list.
    #[arg(long, value_delimiter = ',', default_value = "10,20,200")]
    pub(crate) concurrency: Vec<u32>,
    /// Run as a user of the library would, in this process: enqueue with
    /// `Client::enqueue_many` (batches of --enqueue-batch), run library workers with
    /// `WorkerConfig::default()` except the concurrency, and time from their start until
    /// every handler ran and `Client::stats` shows every task succeeded. Without it,
    /// `tenax worker` children drain, timed by the database's clock.
    #[arg(long)]
    pub(crate) in_process: bool,
    /// With --in-process: hold each worker's buffer of claimed tasks at this size
    /// (`WorkerConfig::prefetch`, at most the claim batch of 100; 0 turns it off).
    /// Unset, the default: the buffer follows the handlers' pace.
    #[arg(long, requires = "in_process")]
    pub(crate) prefetch: Option<u32>,
    /// Tasks per `Client::enqueue_many` call.
    #[arg(long, default_value_t = 1_000)]
    pub(crate) enqueue_batch: u64,
    /// Concurrent loops of the raw claim+complete baseline (batches of --batch).
    #[arg(long, default_value_t = 1)]
    pub(crate) baseline_clients: u32,
    /// Batch of the raw baseline's claims and completions.
    #[arg(long, default_value_t = 100)]
    pub(crate) batch: u32,
    /// Runs of each concurrency; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Longest a run may take.
    #[arg(long, value_parser = crate::common::parse_duration, default_value = "10m")]
    pub(crate) timeout: Duration,
    /// Keep the bench schema afterwards (PostgreSQL).
    #[arg(long)]
    pub(crate) keep: bool,
    /// Print the result as JSON, one line per concurrency.
    #[arg(long)]
    pub(crate) json: bool,
}

/// How `tenax bench scale` drains: worker processes or in-process workers, at one
/// concurrency.
#[derive(Debug, Clone, Args)]
pub(crate) struct DrainSetup {
    /// Worker processes (or in-process workers with --in-process).
    #[arg(long, default_value_t = 1)]
    pub(crate) workers: u32,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 20)]
    pub(crate) concurrency: u32,
    /// Run the workers inside this process instead of as `tenax worker` children.
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Runs; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    pub(crate) runs: usize,
    /// Longest a run may take.
    #[arg(long, value_parser = crate::common::parse_duration, default_value = "10m")]
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
    /// In-process runs: the same drain by the database's clock, the enqueue rate and
    /// the handlers that ran twice.
    pub(crate) library: Option<LibraryDrain>,
}

/// Fill the table with `tasks` pending NOOP tasks through `Client::enqueue_many`.
async fn enqueue_bulk(client: &Client, tasks: u64, batch: u64, run: usize) -> anyhow::Result<()> {
    let bar = progress_bar(tasks, "enqueue");
    let mut created = 0u64;
    let mut start = 0u64;
    while start < tasks {
        let end = (start + batch.max(1)).min(tasks);
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
    setup: &DrainSetup,
    since_id: i64,
    expected: u64,
) -> anyhow::Result<f64> {
    let stop = CancellationToken::new();
    let mut children = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..setup.workers.max(1) {
        if setup.in_process {
            let mut registry = Registry::new();
            registry.register(Noop)?;
            let config = WorkerConfig {
                concurrency: setup.concurrency,
                poll_interval: Duration::from_millis(100),
                ..WorkerConfig::default()
            };
            let worker = Worker::new(client.storage().clone(), registry, config)?;
            handles.push(tokio::spawn(worker.run(stop.clone())));
        } else {
            children.push(spawn_worker(
                url,
                setup.concurrency,
                Duration::from_millis(100),
            )?);
        }
    }
    let window = wait_succeeded(db, since_id, expected, setup.timeout, "drain").await;
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
async fn drain_baseline(db: &BenchDb, args: &DrainArgs) -> anyhow::Result<f64> {
    let since_id = 0;
    let expected = args.tasks;
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

/// One run at one concurrency: Tenax's drain, then the baseline's.
async fn drain_once(
    url: &str,
    client: &Client,
    db: &BenchDb,
    args: &DrainArgs,
    concurrency: u32,
    run: usize,
) -> anyhow::Result<DrainRun> {
    db.reset().await?;
    let (tenax_per_s, library) = if args.in_process {
        let library = drain_in_process(
            client,
            db,
            args.tasks,
            args.enqueue_batch,
            Fleet {
                workers: args.workers,
                concurrency,
                prefetch: args.prefetch,
            },
            args.timeout,
        )
        .await?;
        (library.per_s, Some(library))
    } else {
        enqueue_bulk(client, args.tasks, args.enqueue_batch, run).await?;
        let setup = DrainSetup {
            workers: args.workers,
            concurrency,
            in_process: false,
            runs: args.runs,
            timeout: args.timeout,
            keep: args.keep,
            json: args.json,
        };
        let per_s = drain_with_workers(url, client, db, &setup, 0, args.tasks).await?;
        (per_s, None)
    };
    db.reset().await?;
    db.raw_insert(
        args.tasks,
        10_000,
        &format!("base-{run}-{concurrency}-"),
        false,
    )
    .await?;
    let baseline_per_s = drain_baseline(db, args).await?;
    Ok(DrainRun {
        tenax_per_s,
        baseline_per_s,
        library,
    })
}

pub(crate) async fn drain(database_url: &str, args: DrainArgs) -> anyhow::Result<()> {
    if args.tasks == 0
        || args.runs == 0
        || args.enqueue_batch == 0
        || args.concurrency.is_empty()
        || args.concurrency.contains(&0)
    {
        anyhow::bail!("--tasks, --runs, --enqueue-batch and every --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let db = BenchDb::connect(&url).await?;
    let mut runs: Vec<Vec<DrainRun>> = vec![Vec::new(); args.concurrency.len()];
    // Each run goes through every concurrency in turn, so that a noisy minute of the
    // machine spreads over all of them rather than falling on one.
    for run in 0..args.runs {
        for (level, &concurrency) in args.concurrency.iter().enumerate() {
            runs[level].push(drain_once(&url, &client, &db, &args, concurrency, run).await?);
        }
    }
    drop(db);
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;
    report(backend, &args, &runs);
    Ok(())
}

fn spread(runs: &[DrainRun], figure: impl Fn(&DrainRun) -> f64) -> Spread {
    Spread::of(&runs.iter().map(figure).collect::<Vec<_>>())
}

fn report(backend: &str, args: &DrainArgs, levels: &[Vec<DrainRun>]) {
    let mut table = Table::new();
    table.set_header([
        "backend",
        "what",
        "tasks/s median (min–max)",
        "ratio to baseline",
    ]);
    let clock = if args.in_process {
        "library API in this process, until the stats show every task succeeded"
    } else {
        "worker process(es), database clock"
    };
    for (&concurrency, runs) in args.concurrency.iter().zip(levels) {
        let tenax = spread(runs, |r| r.tenax_per_s);
        let base = spread(runs, |r| r.baseline_per_s);
        let ratio = spread(runs, |r| r.tenax_per_s / r.baseline_per_s);
        let library = runs.iter().all(|r| r.library.is_some()).then(|| {
            let of = |f: fn(&LibraryDrain) -> f64| {
                spread(runs, move |r| r.library.as_ref().map_or(f64::NAN, f))
            };
            (
                of(|l| l.db_clock_per_s),
                of(|l| l.enqueue_per_s),
                runs.iter()
                    .filter_map(|r| r.library.as_ref())
                    .map(|l| l.repeats)
                    .sum::<u64>(),
            )
        });
        if args.json {
            let mut line = serde_json::json!({
                "bench": "drain", "backend": backend, "tasks": args.tasks,
                "workers": args.workers, "concurrency": concurrency,
                "in_process": args.in_process, "prefetch": args.prefetch, "runs": runs.len(),
                "tasks_per_s": tenax, "baseline_per_s": base, "ratio": ratio,
                "baseline_clients": args.baseline_clients, "baseline_batch": args.batch,
                "enqueue_batch": args.enqueue_batch,
                "accounted": args.tasks * runs.len() as u64,
            });
            if let (Some((db_clock, enqueue, repeats)), Some(map)) = (library, line.as_object_mut())
            {
                map.insert("clock".into(), "process, worker start to stats".into());
                map.insert("db_clock_per_s".into(), serde_json::json!(db_clock));
                map.insert("enqueue_per_s".into(), serde_json::json!(enqueue));
                map.insert("repeats".into(), repeats.into());
            }
            println!("{line}");
            continue;
        }
        table.add_row([
            backend.to_owned(),
            format!(
                "tenax: {} worker(s) × {concurrency}{}{}",
                args.workers,
                if args.in_process { " in-process" } else { "" },
                args.prefetch
                    .map_or(String::new(), |n| format!(", buffer held at {n}"))
            ),
            tenax.show(),
            ratio.show_ratio(),
        ]);
        if let Some((db_clock, enqueue, _)) = library {
            table.add_row([
                backend.to_owned(),
                "  the same drains, database clock".to_owned(),
                db_clock.show(),
                String::new(),
            ]);
            table.add_row([
                backend.to_owned(),
                format!("  their enqueue_many, batches of {}", args.enqueue_batch),
                enqueue.show(),
                String::new(),
            ]);
        }
        table.add_row([
            backend.to_owned(),
            format!(
                "raw claim+complete, {} client(s), batches of {}",
                args.baseline_clients, args.batch
            ),
            base.show(),
            "1".to_owned(),
        ]);
    }
    if !args.json {
        println!(
            "drain of {} no-op tasks, {} run(s) each, {clock}:\n{table}",
            args.tasks, args.runs
        );
    }
}
