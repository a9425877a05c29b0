//! `tenax bench latency`: an idle worker in its own process; tasks enqueued one at a
//! time at a fixed rate; enqueue→start measured from the database's own timestamps
//! (`created_at` of the insert, `started_at` of the claim), so no clock of this
//! process takes part. With `--in-process`, the worker is a library `Worker` idle in
//! the producer's process, and each task's latency runs from just before its enqueue
//! call to its handler's start on the monotonic clock (`library.rs`), beside the
//! database's figure of the same tasks. On PostgreSQL the baseline follows: the same
//! table emptied, then a raw insert claimed at once, as many times (at most 300), which
//! is the floor of the path (its two commits, no worker); the ratio is Tenax's p50 over
//! the floor's.
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use tenax::storage::TaskRef;
use tenax::Client;

use crate::common::parse_duration;
use crate::common::{bench_url, quantile, spawn_worker, wait_finished, BenchDb};
use crate::library::latency_in_process;

#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// Tasks to measure [default: 1000 with --in-process, else 500].
    #[arg(long)]
    tasks: Option<usize>,
    /// Tasks enqueued per second, one at a time, open loop [default: 200 with
    /// --in-process, else 50].
    #[arg(long)]
    rate: Option<u32>,
    /// Tasks the worker runs at once [default: 20 with --in-process, else 10].
    #[arg(long)]
    concurrency: Option<u32>,
    /// Run the worker in this process through the library API
    /// (`WorkerConfig::default()` except the concurrency), and measure from just before
    /// each enqueue call to its handler's start.
    #[arg(long)]
    in_process: bool,
    /// Worker poll interval of the worker process (wake-ups, not polling, should decide
    /// the latency); an in-process worker keeps the default.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// Samples of the raw baseline at most (each an insert and a claim, two commits).
const FLOOR_SAMPLES: usize = 300;

/// Nearest-rank p50, p95, p99 and the maximum of the samples (sorted here).
fn percentiles(mut samples: Vec<f64>) -> serde_json::Value {
    samples.sort_by(f64::total_cmp);
    serde_json::json!({
        "p50": quantile(&samples, 0.50), "p95": quantile(&samples, 0.95),
        "p99": quantile(&samples, 0.99), "max": samples.last().copied().unwrap_or(f64::NAN),
    })
}

pub(crate) async fn latency(database_url: &str, args: LatencyArgs) -> anyhow::Result<()> {
    let tasks = args
        .tasks
        .unwrap_or(if args.in_process { 1_000 } else { 500 });
    let rate = args.rate.unwrap_or(if args.in_process { 200 } else { 50 });
    let concurrency = args
        .concurrency
        .unwrap_or(if args.in_process { 20 } else { 10 });
    if tasks == 0 || rate == 0 || concurrency == 0 {
        anyhow::bail!("--tasks, --rate and --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let (ids, enqueue_secs, call_to_start) = if args.in_process {
        let stamped = latency_in_process(&client, tasks, rate, concurrency).await?;
        (
            stamped.ids,
            stamped.enqueue_seconds,
            Some(stamped.call_to_start_ms),
        )
    } else {
        let (ids, secs) =
            with_worker_process(&client, &url, &args, tasks, rate, concurrency).await?;
        (ids, secs, None)
    };

    let mut samples = Vec::with_capacity(ids.len());
    for id in &ids {
        let task = client
            .get(&TaskRef::Id(*id))
            .await?
            .with_context(|| format!("task {id} vanished"))?;
        let start = task
            .started_at
            .with_context(|| format!("task {id} never started"))?;
        samples.push(
            (start - task.created_at)
                .num_microseconds()
                .unwrap_or(i64::MAX) as f64
                / 1000.0,
        );
    }
    let database = percentiles(samples);
    let call_to_start = call_to_start.map(percentiles);
    // The floor, on the same table once it is emptied: as many inserts, each claimed
    // at once, with no worker (PostgreSQL).
    let db = BenchDb::connect(&url).await?;
    db.reset().await?;
    let floor = db
        .raw_latency(tasks.min(FLOOR_SAMPLES))
        .await?
        .map(percentiles);
    drop(db);
    // Tenax's p50 over the floor's: the share of the path that is not the database's.
    let measured = call_to_start.as_ref().unwrap_or(&database);
    let ratio = floor.as_ref().map(|f| {
        measured["p50"].as_f64().unwrap_or(f64::NAN) / f["p50"].as_f64().unwrap_or(f64::NAN)
    });
    let backend = client.storage().backend();
    drop(client);
    crate::common::drop_bench_schema(database_url, false).await?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "latency", "backend": backend, "tasks": tasks,
                "rate_per_s": rate, "concurrency": concurrency,
                "in_process": args.in_process, "enqueue_seconds": enqueue_secs,
                "enqueue_to_start_ms": database, "call_to_handler_ms": call_to_start,
                "baseline_insert_claim_ms": floor, "p50_to_baseline": ratio,
                "accounted": ids.len(),
            })
        );
    } else {
        let mut table = Table::new();
        table.set_header([
            "backend", "measured", "tasks", "rate/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
        ]);
        let mut row = |what: &str, figures: &serde_json::Value| {
            let ms = |key: &str| format!("{:.2}", figures[key].as_f64().unwrap_or(f64::NAN));
            table.add_row([
                backend.to_owned(),
                what.to_owned(),
                tasks.to_string(),
                rate.to_string(),
                ms("p50"),
                ms("p95"),
                ms("p99"),
                ms("max"),
            ]);
        };
        if let Some(figures) = &call_to_start {
            row("enqueue call → handler start (monotonic)", figures);
        }
        row("created_at → started_at (database)", &database);
        if let Some(figures) = &floor {
            row("raw insert, then claim at once (baseline)", figures);
        }
        let worker = if args.in_process {
            "in this process"
        } else {
            "in its own process"
        };
        println!("enqueue→start latency, idle worker × {concurrency} {worker}:\n{table}");
        if let Some(ratio) = ratio {
            println!("p50 to the baseline's: {ratio:.2}");
        }
    }
    Ok(())
}

/// The process mode: a `tenax worker` child, warmed up, then `tasks` single enqueues
/// at `rate`; returns the tasks once all succeeded, and the enqueue phase's length.
async fn with_worker_process(
    client: &Client,
    url: &str,
    args: &LatencyArgs,
    tasks: usize,
    rate: u32,
    concurrency: u32,
) -> anyhow::Result<(Vec<tenax::TaskId>, f64)> {
    let mut worker = spawn_worker(url, concurrency, args.poll_interval)?;
    // Warm up: the worker is ready once it has run one task.
    let warm = client
        .enqueue_raw("NOOP", &serde_json::json!({}))
        .await?
        .task;
    wait_finished(client, &[warm.id], Duration::from_secs(30)).await?;

    let interval = Duration::from_secs_f64(1.0 / f64::from(rate));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ids = Vec::with_capacity(tasks);
    let started = Instant::now();
    for _ in 0..tasks {
        ticker.tick().await;
        ids.push(
            client
                .enqueue_raw("NOOP", &serde_json::json!({}))
                .await?
                .task
                .id,
        );
    }
    let enqueue_secs = started.elapsed().as_secs_f64();
    wait_finished(client, &ids, Duration::from_secs(60)).await?;
    worker.kill().await.ok();
    Ok((ids, enqueue_secs))
}
