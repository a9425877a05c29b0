//! `tenax demo`: the seed article's scenario, end to end, on a fresh SQLite file.
//!
//! It enqueues N `BANK_OPEN_ACCOUNT` tasks; a worker opens the accounts through a flaky
//! bank RPC, retries transient failures with a short backoff, lets invalid id cards die
//! at once and compensates them ("cancel the pending account"). With `--crash` the
//! worker runs in a child process that is killed with SIGKILL half way; running
//! `tenax demo` again resumes the unfinished tasks once their leases expire.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use indicatif::{ProgressBar, ProgressStyle};
use tenax::storage::TaskListParams;
use tenax::{Client, CompensationState, TaskKind, TaskRecord, TaskStatus, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use crate::bank::OpenAccount;
use crate::worker::BankArgs;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Tasks to enqueue.
    #[arg(long, default_value_t = 200)]
    tasks: usize,
    /// Share of customers with an invalid id card (a permanent error).
    #[arg(long, default_value_t = 0.05)]
    invalid_rate: f64,
    /// Tasks run at once.
    #[arg(long, default_value_t = 20)]
    concurrency: u32,
    /// The demo's SQLite file (in the current folder). With a PostgreSQL or MariaDB
    /// `--database-url`, the demo uses its own schema or database `tenax_demo` there.
    #[arg(long, default_value = "tenax-demo.db")]
    file: PathBuf,
    /// Kill the worker (SIGKILL) half way; run `tenax demo` again to finish.
    #[arg(long)]
    crash: bool,
    #[command(flatten)]
    bank: BankArgs,
}

/// Lease of the demo's workers: short, so a crashed worker's tasks return quickly.
const DEMO_LEASE: Duration = Duration::from_secs(2);

fn demo_config(concurrency: u32) -> WorkerConfig {
    WorkerConfig {
        concurrency,
        claim_batch: concurrency,
        ..WorkerConfig::fast(DEMO_LEASE)
    }
}

async fn executions(client: &Client) -> anyhow::Result<Vec<TaskRecord>> {
    let all = client
        .list(&TaskListParams {
            limit: 1_000_000,
            ..Default::default()
        })
        .await?;
    Ok(all)
}

/// Finished: succeeded, or dead with its compensation finished.
fn is_settled(task: &TaskRecord) -> bool {
    match task.status {
        TaskStatus::Succeeded | TaskStatus::Cancelled => true,
        TaskStatus::Dead => !matches!(task.compensation, Some(CompensationState::Pending)),
        _ => false,
    }
}

fn remove_database(path: &std::path::Path) -> anyhow::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot remove {}", PathBuf::from(file).display()))
            }
        }
    }
    Ok(())
}

/// Where the demo runs: a SQLite file of its own, or a schema/database of its own on
/// the server the global `--database-url` names.
enum Target {
    File(PathBuf),
    Postgres(String),
    MySql(String),
}

/// The schema the demo uses on PostgreSQL.
const DEMO_SCHEMA: &str = "tenax_demo";

impl Target {
    fn new(database_url: &str, file: &std::path::Path) -> anyhow::Result<Self> {
        if database_url.starts_with("postgres") {
            if database_url.contains("schema=") {
                anyhow::bail!(
                    "the demo uses a schema of its own ({DEMO_SCHEMA}); drop ?schema= from the URL"
                );
            }
            return Ok(Self::Postgres(database_url.to_owned()));
        }
        if database_url.starts_with("sqlite") {
            return Ok(Self::File(file.to_owned()));
        }
        if database_url.starts_with("mysql") || database_url.starts_with("mariadb") {
            return Ok(Self::MySql(database_url.to_owned()));
        }
        anyhow::bail!("the demo runs on SQLite, PostgreSQL or MariaDB/MySQL, not on {database_url}")
    }

    fn url(&self) -> String {
        match self {
            Self::File(file) => format!("sqlite://{}", file.display()),
            Self::Postgres(base) => {
                let separator = if base.contains('?') { '&' } else { '?' };
                format!("{base}{separator}schema={DEMO_SCHEMA}")
            }
            Self::MySql(server) => tenax::storage::mysql::url_with_database(server, DEMO_SCHEMA),
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::File(file) => file.display().to_string(),
            Self::Postgres(_) => format!("PostgreSQL schema {DEMO_SCHEMA}"),
            Self::MySql(_) => format!("MariaDB/MySQL database {DEMO_SCHEMA}"),
        }
    }

    /// Start from nothing.
    async fn reset(&self) -> anyhow::Result<()> {
        match self {
            Self::File(file) => remove_database(file),
            Self::Postgres(base) => Ok(tenax::storage::postgres::PgStorage::connect(base)
                .await?
                .drop_schema(DEMO_SCHEMA)
                .await?),
            Self::MySql(server) => {
                Ok(tenax::storage::mysql::recreate_database(server, DEMO_SCHEMA).await?)
            }
        }
    }
}

pub(crate) async fn run(database_url: &str, args: DemoArgs) -> anyhow::Result<()> {
    if args.tasks == 0 {
        anyhow::bail!("--tasks must be at least 1");
    }
    let target = Target::new(database_url, &args.file)?;
    let url = target.url();
    let started = Instant::now();
    // Resume a crashed run, if the demo's database holds one.
    let resumable = match &target {
        Target::File(file) => file.exists(),
        Target::Postgres(_) | Target::MySql(_) => true,
    };
    if resumable && !args.crash {
        let client = Client::connect(&url).await?;
        let tasks = executions(&client).await?;
        let unfinished = tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Execute && !is_settled(t))
            .count();
        if unfinished > 0 {
            println!(
                "Resuming a crashed demo: {unfinished} of {} tasks are unfinished in {}.",
                tasks.iter().filter(|t| t.kind == TaskKind::Execute).count(),
                target.describe()
            );
            println!("Tasks the killed worker was running come back when their {DEMO_LEASE:?} lease expires.");
            let expected = tasks.iter().filter(|t| t.kind == TaskKind::Execute).count();
            run_worker_in_process(&client, &args, expected).await?;
            return summary(&client, expected, started).await;
        }
    }
    target.reset().await?;
    let client = Client::connect(&url).await?;
    println!(
        "Enqueueing {} BANK_OPEN_ACCOUNT tasks into {} (bank: {:.0}% transient failures, ~{:?} per call; {:.0}% invalid id cards)",
        args.tasks,
        target.describe(),
        args.bank.bank_failure_rate * 100.0,
        args.bank.bank_latency,
        args.invalid_rate * 100.0
    );
    for n in 0..args.tasks {
        client
            .enqueue::<crate::bank::BankOpenAccount>(OpenAccount::random(n, args.invalid_rate))
            .task_no(format!("ACC-{n:04}"))
            .await?;
    }
    if args.crash {
        return crash_half_way(&client, &url, &args).await;
    }
    run_worker_in_process(&client, &args, args.tasks).await?;
    summary(&client, args.tasks, started).await
}

fn progress_bar(total: usize) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} settled  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

async fn progress(client: &Client) -> anyhow::Result<(usize, String)> {
    let tasks = executions(client).await?;
    let execute: Vec<_> = tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Execute)
        .collect();
    let settled = execute.iter().filter(|t| is_settled(t)).count();
    let count = |s: TaskStatus| execute.iter().filter(|t| t.status == s).count();
    let message = format!(
        "running {} · retrying {} · succeeded {} · dead {}",
        count(TaskStatus::Running),
        count(TaskStatus::Retrying),
        count(TaskStatus::Succeeded),
        count(TaskStatus::Dead)
    );
    Ok((settled, message))
}

async fn run_worker_in_process(
    client: &Client,
    args: &DemoArgs,
    total: usize,
) -> anyhow::Result<()> {
    let worker = Worker::new(
        client.storage().clone(),
        args.bank.registry()?,
        demo_config(args.concurrency),
    )?;
    let stop = CancellationToken::new();
    let handle = tokio::spawn(worker.run(stop.clone()));
    let bar = progress_bar(total);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (settled, message) = progress(client).await?;
        bar.set_position(settled as u64);
        bar.set_message(message);
        if settled >= total {
            break;
        }
        if Instant::now() > deadline {
            bar.abandon();
            anyhow::bail!("the demo did not settle within 5 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bar.finish();
    stop.cancel();
    handle.await.context("worker task")??;
    Ok(())
}

async fn crash_half_way(client: &Client, url: &str, args: &DemoArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the tenax binary")?;
    let mut child = tokio::process::Command::new(exe)
        .args(["--database-url", url, "worker"])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args([
            "--lease-ttl",
            &humantime::format_duration(DEMO_LEASE).to_string(),
        ])
        .args(["--poll-interval", "50ms"])
        .args([
            "--bank-failure-rate",
            &args.bank.bank_failure_rate.to_string(),
        ])
        .args([
            "--bank-latency",
            &humantime::format_duration(args.bank.bank_latency).to_string(),
        ])
        .args([
            "--backoff-base",
            &humantime::format_duration(args.bank.backoff_base).to_string(),
        ])
        .args([
            "--backoff-cap",
            &humantime::format_duration(args.bank.backoff_cap).to_string(),
        ])
        .env("TENAX_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start the worker process")?;
    let pid = child.id().unwrap_or(0);
    println!("Worker process {pid} started; it will be killed with SIGKILL half way.");
    let bar = progress_bar(args.tasks);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (settled, message) = progress(client).await?;
        bar.set_position(settled as u64);
        bar.set_message(message);
        if settled * 2 >= args.tasks {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill().await;
            anyhow::bail!("the worker did not reach half way within 5 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().await.context("cannot kill the worker")?;
    bar.abandon();
    let tasks = executions(client).await?;
    let running = tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Running)
        .count();
    let unfinished = tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Execute && !is_settled(t))
        .count();
    println!("Killed worker {pid} with SIGKILL: {running} task(s) were running under its leases, {unfinished} unfinished.");
    println!("Nothing is lost: run `tenax demo` again to finish the rest.");
    Ok(())
}

fn target_url(client: &Client) -> &'static str {
    match client.storage().backend() {
        "sqlite" => "sqlite://tenax-demo.db",
        "postgres" => "<the same URL>?schema=tenax_demo",
        _ => "<the same server>/tenax_demo",
    }
}

async fn summary(client: &Client, expected: usize, started: Instant) -> anyhow::Result<()> {
    let tasks = executions(client).await?;
    let execute: Vec<_> = tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Execute)
        .collect();
    let count = |s: TaskStatus| execute.iter().filter(|t| t.status == s).count();
    let compensated = execute
        .iter()
        .filter(|t| t.compensation == Some(CompensationState::Succeeded))
        .count();
    let mut histogram: BTreeMap<u32, usize> = BTreeMap::new();
    let mut lease_expired = 0;
    for task in &execute {
        *histogram.entry(task.attempt).or_default() += 1;
        let history = client.attempts(task.id).await?;
        lease_expired += history
            .iter()
            .filter(|a| a.outcome == tenax::AttemptOutcome::LeaseExpired)
            .count();
    }
    let mut table = Table::new();
    table.set_header(["outcome", "tasks"]);
    table.add_row([
        "succeeded".to_owned(),
        count(TaskStatus::Succeeded).to_string(),
    ]);
    table.add_row(["dead".to_owned(), count(TaskStatus::Dead).to_string()]);
    table.add_row(["  of which compensated".to_owned(), compensated.to_string()]);
    table.add_row([
        "attempts lost to a crash (lease expired)".to_owned(),
        lease_expired.to_string(),
    ]);
    println!("{table}");
    let mut attempts = Table::new();
    attempts.set_header(["attempts used", "tasks"]);
    for (n, tasks) in &histogram {
        attempts.add_row([n.to_string(), tasks.to_string()]);
    }
    println!("{attempts}");
    let missing = expected.saturating_sub(execute.len());
    let unsettled = execute.iter().filter(|t| !is_settled(t)).count();
    let uncompensated = count(TaskStatus::Dead) - compensated;
    println!(
        "Check: {} of {expected} tasks present, {missing} missing, {unsettled} unsettled, {uncompensated} dead without compensation. Took {:.1} s.",
        execute.len(),
        started.elapsed().as_secs_f64()
    );
    if missing > 0 || unsettled > 0 || uncompensated > 0 {
        anyhow::bail!("the demo's check failed");
    }
    println!(
        "Inspect any task with `tenax --database-url '{}' tasks show --no ACC-0001`.",
        target_url(client)
    );
    Ok(())
}
