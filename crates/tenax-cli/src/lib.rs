//! `tenax`: the command line of the Tenax task scheduler.
//!
//! Argument parsing here, one module per subcommand, and every action goes through the
//! library's `Client` and `Worker`. The binary (`src/main.rs`) only calls [`main`]; this
//! library target exists so that the fuzz targets can reach the command line's own
//! configuration parser ([`check_config`]). It is not a stable API.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod audit;
mod bank;
mod bulk;
mod config;
mod demo;
mod events;
mod flow;
mod kinds;
mod observe;
mod queues;
mod rates;
mod reference;
mod schedules;
mod serve;
mod tasks;
mod top;
mod worker;
mod workflows;

/// `tenax --version`: the package version and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TENAX_COMMIT"), ")");

/// Durable task scheduler: persisted commands, leased workers, retries, compensation.
#[derive(Debug, Parser)]
#[command(name = "tenax", version = VERSION, about, propagate_version = true)]
struct Cli {
    /// Database URL: `sqlite://PATH` (created when missing), `postgres://...[?schema=NAME]`
    /// or `mysql://...` / `mariadb://...`.
    /// [default: sqlite://tenax.db]
    #[arg(long, global = true, env = "TENAX_DATABASE_URL")]
    database_url: Option<String>,

    /// Configuration file [default: tenax.toml in the current folder, when present].
    #[arg(long, global = true, env = "TENAX_CONFIG", value_name = "PATH")]
    config: Option<std::path::PathBuf>,

    /// Log format on standard error: `text` (human-readable) or `json` (one object per
    /// line, with the fields of the task being run) [default: text].
    #[arg(long, global = true, env = "TENAX_LOG_FORMAT")]
    log_format: Option<observe::LogFormat>,

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
    /// Periodic tasks: cron expressions and fixed intervals.
    #[command(subcommand)]
    Schedules(schedules::SchedulesCommand),
    /// List, pause, resume and limit queues.
    #[command(subcommand)]
    Queues(queues::QueuesCommand),
    /// List, set and remove rate limits per command type.
    #[command(subcommand)]
    RateLimits(rates::RateLimitsCommand),
    /// The audit log: who cancelled, retried, paused or changed what, and when.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// List workflows and show one with its tasks.
    #[command(subcommand)]
    Workflows(workflows::WorkflowsCommand),
    /// Task events: which tasks write them (rules), and where the stream stands.
    #[command(subcommand)]
    Events(events::EventsCommand),
    /// Counts by status, command type and queue, backlogs, the oldest due task's age, and
    /// latency percentiles of recently finished tasks.
    Stats,
    /// A live view: throughput, status counts, latency percentiles and the slowest
    /// running tasks, refreshed until interrupted.
    Top(top::TopArgs),
    /// Apply pending schema migrations.
    Migrate,
    /// Measure against a real backend.
    #[command(subcommand)]
    Bench(tenax_bench::BenchCommand),
    /// Check the configuration and print what it resolves to.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a reference generated from the code (Markdown).
    #[command(hide = true)]
    Reference {
        /// `cli`, `config` or `metrics`.
        #[arg(value_parser = ["cli", "config", "metrics"])]
        which: String,
    },
    /// Run a worker for the built-in commands (BANK_OPEN_ACCOUNT, NOOP, FLOW_STEP, echo) until
    /// interrupted.
    Worker(worker::WorkerArgs),
    /// Serve the HTTP API (and, unless --no-workers, a worker) until interrupted.
    Serve(serve::ServeArgs),
    /// API tokens for `tenax serve`.
    #[command(subcommand)]
    Token(serve::TokenCommand),
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Load the configuration file, environment and flags, validate them, and print the
    /// effective settings; exits non-zero with the reason when they are invalid.
    Check(serve::ServeArgs),
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

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (file, file_path) = config::load(cli.config.as_deref())?;
    let log_format = cli.log_format.or(file.log_format).unwrap_or_default();
    let init_tracing = |default: &str| observe::init_tracing(default, log_format);
    let database_url = cli
        .database_url
        .clone()
        .or_else(|| file.database_url.clone())
        .unwrap_or_else(|| config::DATABASE_URL_DEFAULT.to_owned());
    match cli.command {
        Commands::Demo(args) => demo::run(&database_url, args).await,
        Commands::Bench(command) => {
            init_tracing("warn");
            tenax_bench::run(&database_url, command).await
        }
        Commands::Worker(args) => {
            init_tracing("info");
            worker::run(&database_url, &file, args).await
        }
        Commands::Serve(args) => {
            init_tracing("info");
            serve::run(&database_url, &file, file_path.as_deref(), args).await
        }
        Commands::Token(command) => serve::token(command),
        Commands::Reference { which } => {
            match which.as_str() {
                "cli" => print!("{}", reference::cli_markdown()),
                "metrics" => print!("{}", reference::metrics_markdown()),
                _ => print!("{}", reference::config_markdown()),
            }
            Ok(())
        }
        Commands::Config(ConfigCommand::Check(serve_args)) => {
            let Resolved {
                kinds,
                server,
                warnings,
                worker,
                metrics_addr,
                metrics_sample_interval,
            } = resolve(&file, &serve_args)?;
            match &file_path {
                Some(path) => println!("configuration file: {}", path.display()),
                None => println!("configuration file: none (defaults, environment and flags)"),
            }
            println!("database_url = {database_url:?}");
            println!("log_format = {log_format}");
            println!("metrics_addr = {metrics_addr:?}");
            println!("metrics_sample_interval = {metrics_sample_interval:?}");
            println!("{worker:#?}");
            for rule in &worker.background {
                let hours = match &rule.off_peak {
                    Some(h) => format!(
                        "{}-{} {}",
                        h.start.format("%H:%M"),
                        h.end.format("%H:%M"),
                        h.time_zone
                    ),
                    None => "none".to_owned(),
                };
                println!(
                    "worker.background {:?}: threshold = {}, max_deferral = {}, off_peak = {hours}",
                    rule.queue,
                    rule.threshold,
                    humantime::format_duration(rule.max_deferral)
                );
            }
            println!("server.listen = {}", server.listen);
            println!("server.body_limit = {}", server.body_limit);
            println!("server.command_types = {:?}", server.command_types);
            for t in &server.tokens {
                println!("server.tokens: {:?} ({})", t.name, t.role.as_str());
            }
            for (queue, limit) in &server.queues {
                println!(
                    "server.queues.{queue}.max_pending = {:?}",
                    limit.max_pending
                );
            }
            for (command_type, fields) in kinds.secrets.fields() {
                println!("secrets.{command_type} = {fields:?}");
            }
            for (command_type, retry) in &kinds.retry {
                let policy = match &retry.policy {
                    Some(p) => format!(
                        "backoff = {:?}, base = {}, cap = {}, jitter = {:?}, max_retry_after = {}",
                        p.backoff,
                        humantime::format_duration(p.base),
                        humantime::format_duration(p.cap),
                        p.jitter,
                        humantime::format_duration(p.max_retry_after)
                    ),
                    None => "the command's own backoff".to_owned(),
                };
                println!(
                    "retry.{command_type:?}: {policy}, max_attempts = {}",
                    config::max_attempts_of(&kinds.retry, command_type)
                );
            }
            println!("server.wait_max = {:?}", server.wait_max);
            println!("server.db_timeout = {:?}", server.db_timeout);
            println!("server.batch_max = {}", server.batch_max);
            for (name, target) in &kinds.http.targets {
                println!(
                    "http.targets.{name} = {} {}",
                    target.method, target.base_url
                );
            }
            for (name, path) in &kinds.exec.allow {
                println!("exec.allow.{name} = {}", path.display());
            }
            println!("callbacks.allow_hosts = {:?}", kinds.callbacks.allow_hosts);
            println!(
                "callbacks.secret = {}",
                if kinds.callbacks.secret.is_some() {
                    "set"
                } else {
                    "unset"
                }
            );
            println!(
                "alerts.webhook_url = {}",
                if kinds.alerts.webhook_url.is_some() {
                    "set"
                } else {
                    "unset"
                }
            );
            for warning in &warnings {
                println!("warning: {warning}");
            }
            println!("configuration is valid");
            Ok(())
        }
        other => {
            init_tracing("warn");
            let retry = config::retry_policies(&file.retry)?;
            let client = tenax::Client::connect(&database_url).await?;
            match other {
                Commands::Enqueue(args) => tasks::enqueue(&client, args, &retry).await,
                Commands::Tasks(command) => tasks::run(&client, command, &file.secrets()?).await,
                Commands::Schedules(command) => schedules::run(&client, command, &retry).await,
                Commands::Queues(command) => queues::run(&client, command).await,
                Commands::RateLimits(command) => rates::run(&client, command).await,
                Commands::Audit(command) => audit::run(&client, command).await,
                Commands::Workflows(command) => workflows::run(&client, command).await,
                Commands::Events(command) => events::run(&client, command).await,
                Commands::Stats => top::stats(&client).await,
                Commands::Top(args) => top::run(&client, args).await,
                Commands::Migrate => {
                    println!("schema of {database_url} is up to date");
                    Ok(())
                }
                // Handled above.
                Commands::Demo(_)
                | Commands::Worker(_)
                | Commands::Serve(_)
                | Commands::Token(_)
                | Commands::Bench(_)
                | Commands::Config(_)
                | Commands::Reference { .. } => Ok(()),
            }
        }
    }
}

/// What `tenax config check` resolves a configuration file to.
struct Resolved {
    kinds: kinds::Kinds,
    server: tenax_server::ServerConfig,
    warnings: Vec<String>,
    worker: tenax::WorkerConfig,
    metrics_addr: Option<std::net::SocketAddr>,
    metrics_sample_interval: Duration,
}

/// Build and validate everything a configuration file configures, as `tenax config
/// check` does: the kinds and the event relays, the server, the worker.
fn resolve(file: &config::FileConfig, serve_args: &serve::ServeArgs) -> anyhow::Result<Resolved> {
    let kinds = kinds::Kinds::from_file(file)?;
    let (server, warnings) = serve_args.server_config(&file.server, &kinds)?;
    let worker = tenax::WorkerConfig {
        secrets: kinds.secrets.clone(),
        ..serve_args.worker.config(&file.worker)?
    };
    // Checked only: a scrape's tokens are those of [[server.tokens]].
    worker::metrics_tokens(file)?;
    Ok(Resolved {
        kinds,
        server,
        warnings,
        worker,
        metrics_addr: serve_args.worker.metrics_addr(&file.worker)?,
        metrics_sample_interval: serve_args.worker.metrics_sample_interval(&file.worker)?,
    })
}

/// Parse `text` as `tenax.toml` and validate it as `tenax config check` does, with no
/// flags given: the entry point of the configuration fuzz target. Touches no file, no
/// database and no network.
#[doc(hidden)]
pub fn check_config(text: &str) -> anyhow::Result<()> {
    let file = config::parse(text)?;
    let Commands::Config(ConfigCommand::Check(serve_args)) =
        Cli::try_parse_from(["tenax", "config", "check"])?.command
    else {
        anyhow::bail!("`tenax config check` did not parse as itself");
    };
    resolve(&file, &serve_args).map(|_| ())
}

/// The `tenax` command: parse the arguments, run the subcommand, report its error.
pub fn main() -> ExitCode {
    // Before any HTTP client is built (the http kind's, the senders', the OTLP exporter's).
    tenax_kinds::install_tls_provider();
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
    let result = runtime.block_on(run(cli));
    observe::shutdown();
    match result {
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
    fn check_config_accepts_the_example_and_refuses_bad_tables() {
        let example = include_str!("../../../deploy/tenax.toml");
        assert!(check_config(example).is_ok(), "{:?}", check_config(example));
        for bad in [
            "[worker]\nconcurrency = 0\n",
            "[worker]\nlease_ttl = \"soon\"\n",
            "[worker]\nunknown_key = 1\n",
            "[events]\nbatch = 0\n",
            "[server]\nlisten = \"0.0.0.0:8080\"\n",
            "[exec.allow]\nsh = \"../bin/sh\"\n",
        ] {
            assert!(check_config(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn config_check_hands_the_background_queues_to_the_worker() {
        let text = "[worker]\nqueues = [\"default\", \"bulk\"]\n\
                    [[worker.background]]\nqueue = \"bulk\"\nthreshold = 100\nmax_deferral = \"6h\"\n\
                    off_peak = { start = \"22:00\", end = \"06:00\", time_zone = \"Europe/Paris\" }\n";
        let file = config::parse(text).unwrap();
        let Commands::Config(ConfigCommand::Check(serve_args)) =
            Cli::try_parse_from(["tenax", "config", "check"])
                .unwrap()
                .command
        else {
            panic!("`tenax config check` did not parse as itself");
        };
        let resolved = resolve(&file, &serve_args).unwrap();
        assert_eq!(
            resolved.worker.background,
            vec![tenax::BackgroundQueue {
                queue: "bulk".into(),
                threshold: 100,
                off_peak: Some(tenax::OffPeak {
                    start: chrono::NaiveTime::from_hms_opt(22, 0, 0).unwrap(),
                    end: chrono::NaiveTime::from_hms_opt(6, 0, 0).unwrap(),
                    time_zone: tenax::Tz::Europe__Paris,
                }),
                max_deferral: Duration::from_secs(6 * 3600),
            }]
        );
        // A --queue flag that drops the background queue is refused too.
        let Commands::Config(ConfigCommand::Check(serve_args)) =
            Cli::try_parse_from(["tenax", "config", "check", "--queue", "default"])
                .unwrap()
                .command
        else {
            panic!("`tenax config check --queue default` did not parse");
        };
        let err = resolve(&file, &serve_args).err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("worker.background[0].queue")),
            "{err:?}"
        );
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
