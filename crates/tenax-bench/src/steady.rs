//! `tenax bench steady`: enqueue and processing at the same time. The offered rate
//! steps up from `--start-rate` by `--step` for `--step-time` each, with W worker
//! processes running throughout; a step holds when the backlog at its end is at most
//! `--max-backlog` seconds of its rate and the step's tasks all finish within
//! `--settle` after the enqueues stop. The figure is the highest rate that held,
//! measured as the tasks the step finished per second of database clock. Each run
//! also runs the raw insert+claim+complete life cycle (PostgreSQL), the baseline.
use std::time::{Duration, Instant};

use clap::Args;
use comfy_table::Table;
use indicatif::ProgressBar;
use tenax::Client;

use crate::common::parse_duration;
use crate::common::{bench_url, drop_bench_schema, spawn_worker, wait_succeeded, BenchDb, Spread};

#[derive(Debug, Args)]
pub struct SteadyArgs {
    /// Worker processes.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Tasks each worker runs at once.
    #[arg(long, default_value_t = 20)]
    concurrency: u32,
    /// First offered rate, tasks per second.
    #[arg(long, default_value_t = 500.0)]
    start_rate: f64,
    /// Factor between consecutive rates.
    #[arg(long, default_value_t = 1.25)]
    step: f64,
    /// Highest rate tried.
    #[arg(long, default_value_t = 50_000.0)]
    max_rate: f64,
    /// Time each rate is offered.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    step_time: Duration,
    /// Backlog allowed at the end of a step, in seconds of its rate.
    #[arg(long, default_value_t = 0.5)]
    max_backlog: f64,
    /// Time a step's tasks get to finish after its enqueues stop.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    settle: Duration,
    /// Concurrent loops of the life-cycle baseline (batches of 100).
    #[arg(long, default_value_t = 1)]
    baseline_clients: u32,
    /// Runs; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Keep the bench schema afterwards (PostgreSQL).
    #[arg(long)]
    keep: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Offer `rate` tasks per second for `time`, in one bulk call every 10 ms; returns the
/// tasks created and the backlog (tasks not yet succeeded) when the enqueues stop.
async fn offer(
    client: &Client,
    db: &BenchDb,
    rate: f64,
    time: Duration,
    since_id: i64,
    tag: &str,
) -> anyhow::Result<(u64, u64)> {
    let tick = Duration::from_millis(10);
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut created = 0u64;
    while started.elapsed() < time {
        ticker.tick().await;
        let due = (rate * started.elapsed().as_secs_f64()) as u64;
        if due <= created {
            continue;
        }
        let outcomes = client
            .enqueue_many((created..due).map(|i| {
                client
                    .enqueue_raw("NOOP", &serde_json::json!({ "order": i }))
                    .task_no(format!("{tag}-{i}"))
            }))
            .await?;
        created += outcomes.iter().filter(|o| o.created()).count() as u64;
    }
    let window = db.window(since_id).await?;
    Ok((created, window.other))
}

/// One run: the highest rate that held, as processed tasks per second, and the tasks
/// it created (every one of them succeeded).
async fn one_run(
    url: &str,
    client: &Client,
    db: &BenchDb,
    args: &SteadyArgs,
    run: usize,
) -> anyhow::Result<(f64, u64)> {
    db.reset().await?;
    let mut workers = Vec::new();
    for _ in 0..args.workers.max(1) {
        workers.push(spawn_worker(
            url,
            args.concurrency,
            Duration::from_millis(100),
        )?);
    }
    let bar = ProgressBar::new_spinner();
    let mut best = 0.0f64;
    let mut total = 0u64;
    let mut rate = args.start_rate;
    while rate <= args.max_rate {
        bar.set_message(format!("run {run}: offering {rate:.0} tasks/s"));
        bar.tick();
        let since_id = db.max_id().await?;
        let tag = format!("steady-{run}-{rate:.0}");
        let (created, backlog) = offer(client, db, rate, args.step_time, since_id, &tag).await?;
        total += created;
        let settled = wait_succeeded(db, since_id, created, args.settle, "settle").await;
        let held = settled.is_ok() && backlog as f64 <= args.max_backlog * rate;
        if let Ok(window) = settled {
            if held {
                best = best.max(window.succeeded as f64 / window.seconds().max(1e-6));
            }
        }
        if !held {
            break;
        }
        rate *= args.step.max(1.01);
    }
    bar.finish_and_clear();
    // Every task offered is accounted for before the next run.
    let since_all = 0;
    wait_succeeded(db, since_all, total, Duration::from_secs(120), "finish").await?;
    for mut worker in workers {
        worker.kill().await.ok();
    }
    Ok((best, total))
}

pub(crate) async fn steady(database_url: &str, args: SteadyArgs) -> anyhow::Result<()> {
    if args.runs == 0 || args.start_rate <= 0.0 || args.concurrency == 0 {
        anyhow::bail!("--runs, --start-rate and --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let db = BenchDb::connect(&url).await?;
    let (mut rates, mut baselines, mut accounted) = (Vec::new(), Vec::new(), 0u64);
    for run in 0..args.runs {
        let (rate, total) = one_run(&url, &client, &db, &args, run).await?;
        rates.push(rate);
        accounted += total;
        db.reset().await?;
        if let Some(base) = db
            .raw_lifecycle(args.baseline_clients, 100, args.step_time)
            .await?
        {
            baselines.push(base);
        }
        db.reset().await?;
    }
    drop(db);
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;
    let ratios: Vec<f64> = rates.iter().zip(&baselines).map(|(r, b)| r / b).collect();
    let tenax = Spread::of(&rates);
    let base = (!baselines.is_empty()).then(|| Spread::of(&baselines));
    let ratio = (!ratios.is_empty()).then(|| Spread::of(&ratios));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "steady", "backend": backend, "workers": args.workers,
                "concurrency": args.concurrency, "runs": rates.len(),
                "tasks_per_s": tenax, "baseline_per_s": base, "ratio": ratio,
                "accounted": accounted,
            })
        );
        return Ok(());
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
        format!("tenax: {} worker(s) × {}", args.workers, args.concurrency),
        tenax.show(),
        ratio.map_or("-".to_owned(), |r| r.show_ratio()),
    ]);
    table.add_row([
        backend.to_owned(),
        format!(
            "raw insert+claim+complete, {} client(s), batches of 100",
            args.baseline_clients
        ),
        base.map_or("-".to_owned(), |b| b.show()),
        "1".to_owned(),
    ]);
    println!("highest steady rate with a bounded backlog:\n{table}");
    Ok(())
}
