//! `tenax bench latency`: an idle worker in its own process; tasks enqueued one at a
//! time at a fixed rate; enqueue→start measured from the database's own timestamps
//! (`created_at` of the insert, `started_at` of the claim), so no clock of this
//! process takes part.
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use tenax::storage::TaskRef;
use tenax::Client;

use crate::bench_common::{bench_url, quantile, spawn_worker, wait_finished};
use crate::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct LatencyArgs {
    /// Tasks to measure.
    #[arg(long, default_value_t = 500)]
    tasks: usize,
    /// Tasks enqueued per second, one at a time.
    #[arg(long, default_value_t = 50)]
    rate: u32,
    /// Worker poll interval (wake-ups, not polling, should decide the latency).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn latency(database_url: &str, args: LatencyArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.rate == 0 {
        anyhow::bail!("--tasks and --rate must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let mut worker = spawn_worker(&url, 10, args.poll_interval)?;
    // Warm up: the worker is ready once it has run one task.
    let warm = client
        .enqueue_raw("NOOP", &serde_json::json!({}))
        .await?
        .task;
    wait_finished(&client, &[warm.id], Duration::from_secs(30)).await?;

    let interval = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ids = Vec::with_capacity(args.tasks);
    let started = Instant::now();
    for _ in 0..args.tasks {
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
    wait_finished(&client, &ids, Duration::from_secs(60)).await?;
    worker.kill().await.ok();

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
    samples.sort_by(f64::total_cmp);
    let (p50, p95, p99, max) = (
        quantile(&samples, 0.50),
        quantile(&samples, 0.95),
        quantile(&samples, 0.99),
        samples.last().copied().unwrap_or(f64::NAN),
    );
    let backend = client.storage().backend();
    drop(client);
    crate::bench_common::drop_bench_schema(database_url, false).await?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "latency", "backend": backend, "tasks": args.tasks,
                "rate_per_s": args.rate, "enqueue_seconds": enqueue_secs,
                "enqueue_to_start_ms": {"p50": p50, "p95": p95, "p99": p99, "max": max},
            })
        );
    } else {
        let mut table = Table::new();
        table.set_header([
            "backend", "tasks", "rate/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
        ]);
        table.add_row([
            backend.to_owned(),
            args.tasks.to_string(),
            args.rate.to_string(),
            format!("{p50:.2}"),
            format!("{p95:.2}"),
            format!("{p99:.2}"),
            format!("{max:.2}"),
        ]);
        println!("enqueue→start latency, idle worker in its own process:\n{table}");
    }
    Ok(())
}
