//! `tenax bench`: measurements against a real backend, one module per subcommand
//! (`bench_*.rs`, shared pieces in `bench_common.rs`); the method and the figures are
//! in docs/PERFORMANCE.md.
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Idle-worker enqueue→start latency.
    Latency(crate::bench_latency::LatencyArgs),
    /// How late delayed tasks start after their run time on an idle worker.
    Delayed(crate::bench_delayed::DelayedArgs),
    /// Enqueue rate, one task per transaction against bulk enqueue.
    Enqueue(crate::bench_enqueue::EnqueueArgs),
    /// Drain rate of tasks enqueued beforehand, against the raw claim+complete baseline.
    Drain(crate::bench_drain::DrainArgs),
    /// Drain rate with a million finished rows in the table, against an empty table.
    Scale(crate::bench_scale::ScaleArgs),
    /// Highest enqueue-and-process rate with a bounded backlog, against the raw life cycle.
    Steady(crate::bench_steady::SteadyArgs),
    /// The database's own limits: raw claim+complete, life cycle and multi-row insert.
    Baseline(crate::bench_baseline::BaselineArgs),
    /// The same notifications sent by single tasks and by a batch command (batches of 200).
    Batch(crate::bench_batch::BatchArgs),
}

pub(crate) async fn run(database_url: &str, command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Latency(args) => crate::bench_latency::latency(database_url, args).await,
        BenchCommand::Delayed(args) => crate::bench_delayed::delayed(database_url, args).await,
        BenchCommand::Enqueue(args) => crate::bench_enqueue::enqueue(database_url, args).await,
        BenchCommand::Drain(args) => crate::bench_drain::drain(database_url, args).await,
        BenchCommand::Scale(args) => crate::bench_scale::scale(database_url, args).await,
        BenchCommand::Steady(args) => crate::bench_steady::steady(database_url, args).await,
        BenchCommand::Baseline(args) => crate::bench_baseline::baseline(database_url, args).await,
        BenchCommand::Batch(args) => crate::bench_batch::batch(database_url, args).await,
    }
}
