//! `tenax bench delayed`: how late delayed tasks start on an idle worker.
//!
//! Tasks are enqueued ahead of time, each to run at its own instant (`--lead` from now,
//! then one every `--spacing`), for an idle worker in its own process whose poll
//! interval is far longer than the target precision. The lateness of each start is
//! `started_at - run_at`, both from the database's clock: no clock of this process
//! takes part.
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use tenax::storage::TaskRef;
use tenax::Client;

use crate::common::parse_duration;
use crate::common::{bench_url, quantile, spawn_worker, wait_finished};

#[derive(Debug, Args)]
pub struct DelayedArgs {
    /// Tasks to measure.
    #[arg(long, default_value_t = 200)]
    tasks: usize,
    /// Time from now to the first task's run time (longer than the enqueues take).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    lead: Duration,
    /// Time between the run times of consecutive tasks.
    #[arg(long, value_parser = parse_duration, default_value = "50ms")]
    spacing: Duration,
    /// Worker poll interval (the worker's timer, not polling, should decide the start).
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    poll_interval: Duration,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn delayed(database_url: &str, args: DelayedArgs) -> anyhow::Result<()> {
    if args.tasks == 0 {
        anyhow::bail!("--tasks must be positive");
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

    let first = client.storage().now().await? + chrono::TimeDelta::from_std(args.lead)?;
    let spacing = chrono::TimeDelta::from_std(args.spacing)?;
    let mut ids = Vec::with_capacity(args.tasks);
    for i in 0..args.tasks {
        let at = first + spacing * i32::try_from(i).context("too many tasks")?;
        ids.push(
            client
                .enqueue_raw("NOOP", &serde_json::json!({}))
                .run_at(at)
                .await?
                .task
                .id,
        );
    }
    let horizon = args.lead + args.spacing * u32::try_from(args.tasks).unwrap_or(u32::MAX);
    wait_finished(&client, &ids, horizon + Duration::from_secs(60)).await?;
    worker.kill().await.ok();

    let mut samples = Vec::with_capacity(ids.len());
    let mut enqueued_late = 0;
    for id in &ids {
        let task = client
            .get(&TaskRef::Id(*id))
            .await?
            .with_context(|| format!("task {id} vanished"))?;
        if task.created_at > task.run_at {
            enqueued_late += 1;
        }
        let start = task
            .started_at
            .with_context(|| format!("task {id} never started"))?;
        samples.push((start - task.run_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0);
    }
    if enqueued_late > 0 {
        anyhow::bail!("{enqueued_late} task(s) were enqueued after their run time: raise --lead");
    }
    samples.sort_by(f64::total_cmp);
    let (p50, p95, max) = (
        quantile(&samples, 0.50),
        quantile(&samples, 0.95),
        samples.last().copied().unwrap_or(f64::NAN),
    );
    let min = samples.first().copied().unwrap_or(f64::NAN);
    let backend = client.storage().backend();
    drop(client);
    crate::common::drop_bench_schema(database_url, false).await?;
    let poll_ms = args.poll_interval.as_secs_f64() * 1000.0;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "delayed", "backend": backend, "tasks": args.tasks,
                "poll_interval_ms": poll_ms,
                "start_minus_run_at_ms": {"min": min, "p50": p50, "p95": p95, "max": max},
            })
        );
    } else {
        let mut table = Table::new();
        table.set_header([
            "backend", "tasks", "poll ms", "min ms", "p50 ms", "p95 ms", "max ms",
        ]);
        table.add_row([
            backend.to_owned(),
            args.tasks.to_string(),
            format!("{poll_ms:.0}"),
            format!("{min:.2}"),
            format!("{p50:.2}"),
            format!("{p95:.2}"),
            format!("{max:.2}"),
        ]);
        println!("delayed start (start − run_at), idle worker in its own process:\n{table}");
    }
    Ok(())
}
