//! `tenax enqueue`, `tenax tasks ...` and `tenax stats`.
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::TaskListParams;
use tenax::{Client, CommandDefaults, TaskRecord, TaskStatus};

use crate::{parse_duration, TaskSelector};

#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// Command type name (for example BANK_OPEN_ACCOUNT).
    command_type: String,
    /// Payload (the command's context) as JSON.
    #[arg(default_value = "{}")]
    payload: String,
    /// Business number (idempotency key); generated when absent.
    #[arg(long = "no", value_name = "TASK_NO")]
    task_no: Option<String>,
    /// Queue.
    #[arg(long, default_value = CommandDefaults::STANDARD.queue)]
    queue: String,
    /// Priority 0-9 (9 most urgent).
    #[arg(long, default_value_t = CommandDefaults::STANDARD.priority)]
    priority: u8,
    /// Attempt budget [default: the `max_attempts` of `[retry."TYPE"]` in tenax.toml,
    /// else 5].
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Per-attempt timeout [default: 30m, `CommandDefaults::STANDARD`].
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Run no sooner than this delay from now (for example 30s).
    #[arg(long, value_parser = parse_duration)]
    run_in: Option<Duration>,
    /// The payload's shape version (the command's VERSION it was written for).
    #[arg(long, default_value_t = 1)]
    payload_version: u32,
    /// Business key: at most --concurrency-limit tasks with this key run at once.
    #[arg(long, value_name = "KEY")]
    concurrency_key: Option<String>,
    /// How many tasks of the key may run at once (1-1000).
    #[arg(
        long,
        value_name = "N",
        requires = "concurrency_key",
        default_value_t = 1
    )]
    concurrency_limit: u32,
    /// Where to POST the task's final outcome (an `http` or `https` URL), signed, by
    /// a worker or server with `[callbacks]` whose `allow_hosts` names its host.
    #[arg(long, value_name = "URL")]
    callback_url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TasksCommand {
    /// List tasks, newest first.
    List(ListArgs),
    /// Show one task with its attempt history.
    Show(TaskSelector),
    /// Retry a dead task with a fresh attempt budget (history is kept).
    Retry(TaskSelector),
    /// Cancel a task: at once if it has not started; if it is running, request the
    /// cancel (its handler is signalled at its worker's next heartbeat and the task
    /// ends cancelled when the handler stops).
    Cancel(TaskSelector),
    /// Cancel, retry or reprioritise every task a filter matches (up to --limit).
    #[command(subcommand)]
    Bulk(crate::bulk::BulkCommand),
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only this status.
    #[arg(long)]
    status: Option<TaskStatus>,
    /// Only this command type.
    #[arg(long = "type")]
    command_type: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only running tasks started longer ago than this (for example 10m), by the
    /// database clock: tasks that may be stuck.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    running_longer_than: Option<Duration>,
    /// At most this many.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

pub(crate) async fn enqueue(
    client: &Client,
    args: EnqueueArgs,
    retry: &std::collections::BTreeMap<String, crate::config::CommandRetry>,
) -> anyhow::Result<()> {
    let payload: serde_json::Value =
        serde_json::from_str(&args.payload).context("the payload is not valid JSON")?;
    let mut enqueue = client
        .enqueue_raw(&args.command_type, &payload)
        .queue(args.queue)
        .priority(args.priority)
        .max_attempts(
            args.max_attempts
                .unwrap_or_else(|| crate::config::max_attempts_of(retry, &args.command_type)),
        )
        .timeout(args.timeout.unwrap_or(CommandDefaults::STANDARD.timeout))
        .payload_version(args.payload_version);
    if let Some(no) = args.task_no {
        enqueue = enqueue.task_no(no);
    }
    if let Some(delay) = args.run_in {
        enqueue = enqueue.run_in(delay);
    }
    if let Some(key) = args.concurrency_key {
        enqueue = enqueue
            .concurrency_key(key)
            .concurrency_limit(args.concurrency_limit);
    }
    if let Some(url) = args.callback_url {
        enqueue = enqueue.callback_url(url);
    }
    let inserted = enqueue.await?;
    let verb = if inserted.created {
        "enqueued"
    } else {
        "already enqueued"
    };
    println!(
        "{verb} task {} (task_no {}, {}, runs at {})",
        inserted.task.id, inserted.task.task_no, inserted.task.status, inserted.task.run_at
    );
    Ok(())
}

/// Run a `tenax tasks` command. Secret payload fields (`secrets`) are masked in
/// everything shown, as in the API's answers.
pub(crate) async fn run(
    client: &Client,
    command: TasksCommand,
    secrets: &tenax::Secrets,
) -> anyhow::Result<()> {
    match command {
        TasksCommand::List(args) => list(client, args, secrets).await,
        TasksCommand::Show(selector) => show(client, &selector, secrets).await,
        TasksCommand::Retry(selector) => {
            let task = client.retry(selector.to_ref()?).await?;
            println!(
                "task {} ({}) is {} again with a fresh attempt budget",
                task.id, task.task_no, task.status
            );
            record_task(client, "task.retry", &task).await
        }
        TasksCommand::Cancel(selector) => {
            let task = client.cancel(selector.to_ref()?).await?;
            if task.status == TaskStatus::Running {
                println!(
                    "task {} ({}) is running: cancel requested; its handler is signalled at the next heartbeat",
                    task.id, task.task_no
                );
            } else {
                println!("task {} ({}) is {}", task.id, task.task_no, task.status);
            }
            record_task(client, "task.cancel", &task).await
        }
        TasksCommand::Bulk(command) => crate::bulk::run(client, command).await,
    }
}

/// Record a single-task action in the audit log (target: the task id).
async fn record_task(client: &Client, action: &str, task: &TaskRecord) -> anyhow::Result<()> {
    crate::audit::record(
        client,
        action,
        &task.id.to_string(),
        serde_json::json!({
            "task_no": task.task_no.as_str(),
            "command_type": task.command_type,
            "status": task.status.as_str(),
        }),
    )
    .await
}

fn short(text: Option<&str>, max: usize) -> String {
    let text = text.unwrap_or("");
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

async fn list(client: &Client, args: ListArgs, secrets: &tenax::Secrets) -> anyhow::Result<()> {
    let mut status = args.status;
    let mut started_before = None;
    if let Some(longer_than) = args.running_longer_than {
        if status.is_some_and(|s| s != TaskStatus::Running) {
            anyhow::bail!(
                "--running-longer-than lists running tasks; drop --status or use --status running"
            );
        }
        status = Some(TaskStatus::Running);
        let longer_than = chrono::TimeDelta::from_std(longer_than)
            .context("--running-longer-than is out of range")?;
        let now = client.storage().now().await?;
        started_before = Some(
            now.checked_sub_signed(longer_than)
                .context("--running-longer-than is out of range")?,
        );
    }
    let tasks = client
        .list(&TaskListParams {
            status,
            command_type: args.command_type,
            queue: args.queue,
            before_id: None,
            limit: args.limit,
            started_before,
            ..Default::default()
        })
        .await?;
    let mut table = Table::new();
    table.set_header([
        "id",
        "task_no",
        "type",
        "kind",
        "status",
        "attempt",
        "queue",
        "prio",
        "run at",
        "last error",
    ]);
    for t in &tasks {
        let masker = secrets.masker(&t.command_type, &t.payload);
        let error = t.last_error.as_deref().map(|e| masker.text(e));
        table.add_row([
            t.id.to_string(),
            t.task_no.to_string(),
            t.command_type.clone(),
            t.kind.as_str().to_owned(),
            t.status.to_string(),
            format!("{}/{}", t.attempt, t.max_attempts),
            t.queue.clone(),
            t.priority.get().to_string(),
            t.run_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            short(error.as_deref(), 40),
        ]);
    }
    println!("{table}");
    println!("{} task(s)", tasks.len());
    Ok(())
}

fn describe(task: &TaskRecord, secrets: &tenax::Secrets) -> Table {
    let mut table = Table::new();
    let mut payload = serde_json::from_str(&task.payload)
        .unwrap_or_else(|_| serde_json::Value::String(task.payload.clone()));
    let masker = secrets.mask_payload(&task.command_type, &mut payload);
    let payload = if masker.is_none() {
        task.payload.clone()
    } else {
        payload.to_string()
    };
    let result = task.result.as_deref().map(|r| masker.json_text(r));
    let error = task.last_error.as_deref().map(|e| masker.text(e));
    let time =
        |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.to_rfc3339()).unwrap_or_default();
    let rows: Vec<(&str, String)> = vec![
        ("id", task.id.to_string()),
        ("task_no", task.task_no.to_string()),
        ("type", task.command_type.clone()),
        ("kind", task.kind.as_str().to_owned()),
        (
            "parent",
            task.parent_id.map(|p| p.to_string()).unwrap_or_default(),
        ),
        ("status", task.status.to_string()),
        (
            "attempt",
            format!("{} of {}", task.attempt, task.max_attempts),
        ),
        ("lease epoch", task.lease_epoch.to_string()),
        ("lease owner", task.lease_owner.clone().unwrap_or_default()),
        ("lease expires", time(task.lease_expires_at)),
        (
            "queue / priority",
            format!("{} / {}", task.queue, task.priority.get()),
        ),
        ("run at", task.run_at.to_rfc3339()),
        (
            "timeout",
            format!("{:?}", Duration::from_millis(task.timeout_ms)),
        ),
        ("payload", payload),
        ("payload version", task.payload_version.to_string()),
        (
            "concurrency key",
            task.concurrency_key
                .as_ref()
                .map(|k| format!("{k} (at most {} at once)", task.concurrency_limit))
                .unwrap_or_default(),
        ),
        ("result", result.unwrap_or_default().into_owned()),
        ("last error", error.unwrap_or_default().into_owned()),
        (
            "compensation",
            task.compensation
                .map(|c| c.as_str().to_owned())
                .unwrap_or_default(),
        ),
        ("created", task.created_at.to_rfc3339()),
        ("started", time(task.started_at)),
        ("finished", time(task.finished_at)),
    ];
    for (name, value) in rows {
        table.add_row([name.to_owned(), value]);
    }
    table
}

async fn show(
    client: &Client,
    selector: &TaskSelector,
    secrets: &tenax::Secrets,
) -> anyhow::Result<()> {
    let task_ref = selector.to_ref()?;
    let task = client
        .get(&task_ref)
        .await?
        .with_context(|| format!("task {task_ref} not found"))?;
    println!("{}", describe(&task, secrets));
    let masker = secrets.masker(&task.command_type, &task.payload);
    let attempts = client.attempts(task.id).await?;
    let mut table = Table::new();
    table.set_header([
        "attempt", "epoch", "worker", "started", "duration", "outcome", "error",
    ]);
    for a in &attempts {
        let duration = a
            .finished_at
            .map(|f| format!("{} ms", (f - a.started_at).num_milliseconds()))
            .unwrap_or_default();
        table.add_row([
            a.attempt.to_string(),
            a.epoch.to_string(),
            a.worker.clone(),
            a.started_at.format("%H:%M:%S%.3f").to_string(),
            duration,
            a.outcome.as_str().to_owned(),
            short(a.error.as_deref().map(|e| masker.text(e)).as_deref(), 60),
        ]);
    }
    println!(
        "attempt history (last {}):\n{table}",
        tenax::storage::ATTEMPT_HISTORY_LEN
    );
    Ok(())
}
