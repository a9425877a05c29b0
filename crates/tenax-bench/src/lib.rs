//! `tenax bench`: measurements against a real backend, one module per subcommand
//! (`drain.rs`, `latency.rs`, ..., shared pieces in `common.rs`); the method and the
//! figures are in docs/PERFORMANCE.md.
//!
//! The `tenax` command line parses [`BenchCommand`] and calls [`run`]; nothing else
//! uses this crate, and no product crate holds bench code. Subcommands that drain with
//! `tenax worker` children start the running executable, so they work only from the
//! `tenax` binary. It is not a stable API.
#![forbid(unsafe_code)]

use clap::Subcommand;

mod baseline;
mod batch;
mod common;
mod delayed;
mod drain;
mod enqueue;
mod latency;
mod library;
mod raw;
mod scale;
mod steady;

/// The subcommands of `tenax bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Idle-worker enqueue→start latency.
    Latency(crate::latency::LatencyArgs),
    /// How late delayed tasks start after their run time on an idle worker.
    Delayed(crate::delayed::DelayedArgs),
    /// Enqueue rate, one task per transaction against bulk enqueue.
    Enqueue(crate::enqueue::EnqueueArgs),
    /// Drain rate of tasks enqueued beforehand, against the raw claim+complete baseline.
    Drain(crate::drain::DrainArgs),
    /// Drain rate with a million finished rows in the table, against an empty table.
    Scale(crate::scale::ScaleArgs),
    /// Highest enqueue-and-process rate with a bounded backlog, against the raw life cycle.
    Steady(crate::steady::SteadyArgs),
    /// The database's own limits: raw claim+complete, life cycle and multi-row insert.
    Baseline(crate::baseline::BaselineArgs),
    /// The same notifications sent by single tasks and by a batch command (batches of 200).
    Batch(crate::batch::BatchArgs),
}

/// Run one `tenax bench` subcommand against `database_url`, on a database of the run's
/// own (see each subcommand), printing its figures on standard output.
pub async fn run(database_url: &str, command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Latency(args) => crate::latency::latency(database_url, args).await,
        BenchCommand::Delayed(args) => crate::delayed::delayed(database_url, args).await,
        BenchCommand::Enqueue(args) => crate::enqueue::enqueue(database_url, args).await,
        BenchCommand::Drain(args) => crate::drain::drain(database_url, args).await,
        BenchCommand::Scale(args) => crate::scale::scale(database_url, args).await,
        BenchCommand::Steady(args) => crate::steady::steady(database_url, args).await,
        BenchCommand::Baseline(args) => crate::baseline::baseline(database_url, args).await,
        BenchCommand::Batch(args) => crate::batch::batch(database_url, args).await,
    }
}
