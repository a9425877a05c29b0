//! `tenax`: the command line of the Tenax task scheduler.
//!
//! A thin binary: argument parsing here, one module per subcommand, and every action
//! goes through the library's `Client` and `Worker`.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod bank;
mod bench;
mod demo;
mod tasks;
mod worker;

/// Durable task scheduler: persisted commands, leased workers, retries, compensation.
#[derive(Debug, Parser)]
#[command(name = "tenax", version, about, propagate_version = true)]
struct Cli {
    /// Database URL: `sqlite://PATH` (created when missing), `postgres://...[?schema=NAME]`
    /// or `mysql://...` / `mariadb://...`.
    #[arg(
        long,
        global = true,
        env = "TENAX_DATABASE_URL",
        default_value = "sqlite://tenax.db"
    )]
    database_url: String,

    #[command(subcommand)]
    command: Commands,
}

#[derive(Debug, Subcommand)]
enum Commands {
    /// Run the seed article's scenario: bank accounts opened through a flaky RPC,
    /// retried, dead, compensated, and recovered after a crash.
    Demo(demo::DemoArgs),
    /// Enqueue a task.
    Enqueue(tasks::EnqueueArgs),
    /// Inspect and act on tasks.
    #[command(subcommand)]
    Tasks(tasks::TasksCommand),
    /// Counts by status and command type.
    Stats,
    /// Apply pending schema migrations.
    Migrate,
    /// Measure against a real backend.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run a worker for the built-in commands (BANK_OPEN_ACCOUNT, NOOP) until interrupted.
    Worker(worker::WorkerArgs),
}

/// Selects one task by id or by `--no TASK_NO`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct TaskSelector {
    /// Task id.
    id: Option<i64>,
    /// Task business number.
    #[arg(long = "no", value_name = "TASK_NO")]
    task_no: Option<String>,
}

impl TaskSelector {
    fn to_ref(&self) -> anyhow::Result<tenax::storage::TaskRef> {
        match (&self.id, &self.task_no) {
            (Some(id), _) => Ok(tenax::storage::TaskRef::Id(tenax::TaskId(*id))),
            (None, Some(no)) => Ok(tenax::storage::TaskRef::No(tenax::TaskNo::new(no.clone())?)),
            (None, None) => anyhow::bail!("give a task id or --no TASK_NO"),
        }
    }
}

/// Parse `250ms`, `30s`, `5m`, `1h`.
fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value).map_err(|e| format!("{e} (examples: 250ms, 30s, 5m)"))
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TENAX_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Commands::Demo(args) => demo::run(&cli.database_url, args).await,
        Commands::Bench(command) => {
            init_tracing("warn");
            bench::run(&cli.database_url, command).await
        }
        Commands::Worker(args) => {
            init_tracing("info");
            worker::run(&cli.database_url, args).await
        }
        other => {
            init_tracing("warn");
            let client = tenax::Client::connect(&cli.database_url).await?;
            match other {
                Commands::Enqueue(args) => tasks::enqueue(&client, args).await,
                Commands::Tasks(command) => tasks::run(&client, command).await,
                Commands::Stats => tasks::stats(&client).await,
                Commands::Migrate => {
                    println!("schema of {} is up to date", cli.database_url);
                    Ok(())
                }
                Commands::Demo(_) | Commands::Worker(_) | Commands::Bench(_) => Ok(()),
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
