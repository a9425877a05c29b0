//! `tenax-torture`: run torture scenarios against Tenax, or serve as one of their
//! worker processes.
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tenax_torture::run::{ledger_url, run, seed_from_env};
use tenax_torture::tiers::{append_results, long_part, plan, SCENARIOS};

#[derive(Debug, Parser)]
#[command(
    name = "tenax-torture",
    version,
    about = "Torture scenarios for Tenax, checked against an external ledger"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run one scenario (or `all`) of the fast tier; exit 1 on any violation.
    Run {
        /// Scenario: kill9-sqlite, kill9-postgres, pg-restart, mariadb, skew-postgres,
        /// skew-mariadb, db-clock-postgres, db-clock-mariadb, proxy, proxy-mariadb,
        /// enqueuer-kill, pause-term, soak, selftest-stale, or all.
        #[arg(long, default_value = "all")]
        scenario: String,
        /// Replay this seed (default: TENAX_SEED, else a fresh one, printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Factor on every count of the scenario.
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// The ledger database (PostgreSQL) [env: TENAX_TORTURE_LEDGER_URL, else TENAX_TEST_POSTGRES_URL].
        #[arg(long)]
        ledger_url: Option<String>,
    },
    /// Run one part of the long tier and append its rows to docs/RELIABILITY.md.
    Long {
        /// Part 1 to 11.
        #[arg(long)]
        part: u32,
        /// Replay this seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Factor on the part's counts (1 is the full part).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// The ledger database (PostgreSQL).
        #[arg(long)]
        ledger_url: Option<String>,
        /// The results document.
        #[arg(long, default_value = "docs/RELIABILITY.md")]
        results: PathBuf,
    },
    /// Serve as a torture worker process (started by the harness).
    Worker(tenax_torture::worker::WorkerArgs),
    /// Serve as the enqueuing client process of a run (started by the harness).
    Enqueue(tenax_torture::enqueuer::EnqueueArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let program = std::env::current_exe().context("the path of this program")?;
    match cli.command {
        Commands::Worker(args) => tenax_torture::worker::run(args).await,
        Commands::Enqueue(args) => tenax_torture::enqueuer::run(args).await,
        Commands::Run {
            scenario,
            seed,
            scale,
            ledger_url: url,
        } => {
            let url = url
                .or_else(ledger_url)
                .context("no ledger: set TENAX_TORTURE_LEDGER_URL")?;
            let seed = seed.unwrap_or_else(seed_from_env);
            let names: Vec<&str> = if scenario == "all" {
                SCENARIOS
                    .iter()
                    .copied()
                    .filter(|s| !s.starts_with("selftest"))
                    .collect()
            } else {
                vec![scenario.as_str()]
            };
            let mut clean = true;
            for name in names {
                let report = run(plan(name, seed, scale)?, program.clone(), &url).await?;
                clean &= report.is_clean() != name.starts_with("selftest");
            }
            anyhow::ensure!(clean, "violations found (seed {seed})");
            Ok(())
        }
        Commands::Long {
            part,
            seed,
            scale,
            ledger_url: url,
            results,
        } => {
            let url = url
                .or_else(ledger_url)
                .context("no ledger: set TENAX_TORTURE_LEDGER_URL")?;
            let seed = seed.unwrap_or_else(seed_from_env);
            let mut reports = Vec::new();
            for p in long_part(part, seed, scale)? {
                reports.push(run(p, program.clone(), &url).await?);
            }
            append_results(&results, part, scale, &reports)?;
            anyhow::ensure!(
                reports.iter().all(|r| r.is_clean()),
                "violations found (seed {seed})"
            );
            Ok(())
        }
    }
}
