//! `tenax tasks bulk cancel|retry|reprioritise`: one action on every task a filter
//! matches, up to a limit, recorded in the audit log.
use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use tenax::storage::{BulkAction, TaskFilter};
use tenax::{Client, Priority, TaskId, TaskStatus};

#[derive(Debug, Subcommand)]
pub(crate) enum BulkCommand {
    /// Cancel the matching tasks that wait (pending, retrying, blocked), and ask the
    /// running ones to stop; compensation tasks and finished tasks are left alone.
    Cancel(FilterArgs),
    /// Retry the matching dead tasks (not those whose compensation still runs) with a
    /// fresh attempt budget.
    Retry(FilterArgs),
    /// Set the priority of the matching tasks that wait (pending, retrying, blocked).
    Reprioritise(ReprioritiseArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ReprioritiseArgs {
    /// The new priority, 0-9 (9 most urgent).
    #[arg(long)]
    priority: u8,
    #[command(flatten)]
    filter: FilterArgs,
}

#[derive(Debug, Args)]
pub(crate) struct FilterArgs {
    /// Only tasks in this status (repeat for several; default: every status the action
    /// applies to).
    #[arg(long)]
    status: Vec<TaskStatus>,
    /// Only this command type.
    #[arg(long = "type")]
    command_type: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only these task ids (repeat for several; at most 10000).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<i64>,
    /// Only tasks created at or after this instant: RFC 3339 (2026-05-01T12:00:00Z) or a
    /// duration ago by the database clock (for example 2h).
    #[arg(long, value_name = "WHEN")]
    created_after: Option<String>,
    /// Only tasks created before this instant (same forms as --created-after).
    #[arg(long, value_name = "WHEN")]
    created_before: Option<String>,
    /// Change at most this many tasks (1-100000), lowest ids first.
    #[arg(long, default_value_t = 1000)]
    limit: u32,
}

/// An RFC 3339 instant, or a duration before the database's now.
async fn instant(client: &Client, flag: &str, value: &str) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(value) {
        return Ok(at.with_timezone(&Utc));
    }
    let ago = crate::parse_duration(value).map_err(|e| {
        anyhow::anyhow!("{flag} {value:?}: not an RFC 3339 instant nor a duration: {e}")
    })?;
    let ago =
        chrono::TimeDelta::from_std(ago).with_context(|| format!("{flag} is out of range"))?;
    let now = client.storage().now().await?;
    now.checked_sub_signed(ago)
        .with_context(|| format!("{flag} is out of range"))
}

impl FilterArgs {
    async fn filter(&self, client: &Client) -> anyhow::Result<TaskFilter> {
        let created_after = match &self.created_after {
            Some(v) => Some(instant(client, "--created-after", v).await?),
            None => None,
        };
        let created_before = match &self.created_before {
            Some(v) => Some(instant(client, "--created-before", v).await?),
            None => None,
        };
        Ok(TaskFilter {
            statuses: self.status.clone(),
            command_type: self.command_type.clone(),
            queue: self.queue.clone(),
            ids: (!self.ids.is_empty()).then(|| self.ids.iter().copied().map(TaskId).collect()),
            created_after,
            created_before,
        })
    }
}

/// The filter as the audit log's target: its set fields, `key=value` separated by spaces.
fn summary(filter: &TaskFilter) -> String {
    let mut parts = Vec::new();
    if !filter.statuses.is_empty() {
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        parts.push(format!("status={}", statuses.join(",")));
    }
    if let Some(t) = &filter.command_type {
        parts.push(format!("type={t}"));
    }
    if let Some(q) = &filter.queue {
        parts.push(format!("queue={q}"));
    }
    if let Some(ids) = &filter.ids {
        parts.push(format!("ids={}", ids.len()));
    }
    if let Some(t) = filter.created_after {
        parts.push(format!("created_after={}", t.to_rfc3339()));
    }
    if let Some(t) = filter.created_before {
        parts.push(format!("created_before={}", t.to_rfc3339()));
    }
    if parts.is_empty() {
        "all".to_owned()
    } else {
        parts.join(" ")
    }
}

fn filter_json(filter: &TaskFilter) -> serde_json::Value {
    serde_json::json!({
        "statuses": filter.statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "command_type": filter.command_type,
        "queue": filter.queue,
        "ids": filter.ids.as_ref().map(|ids| ids.iter().map(|id| id.0).collect::<Vec<_>>()),
        "created_after": filter.created_after,
        "created_before": filter.created_before,
    })
}

pub(crate) async fn run(client: &Client, command: BulkCommand) -> anyhow::Result<()> {
    let (name, action, args) = match &command {
        BulkCommand::Cancel(args) => ("tasks.bulk_cancel", BulkAction::Cancel, args),
        BulkCommand::Retry(args) => ("tasks.bulk_retry", BulkAction::Retry, args),
        BulkCommand::Reprioritise(r) => (
            "tasks.bulk_reprioritise",
            BulkAction::Reprioritise(Priority::new(r.priority)?),
            &r.filter,
        ),
    };
    let filter = args.filter(client).await?;
    let outcome = client.bulk(filter.clone(), action, args.limit).await?;
    let mut details = serde_json::json!({
        "filter": filter_json(&filter),
        "limit": args.limit,
        "changed": outcome.changed,
    });
    match action {
        BulkAction::Cancel => {
            details["cancel_requested"] = outcome.cancel_requested.into();
            println!(
                "cancelled {} task(s); asked {} running task(s) to stop",
                outcome.changed, outcome.cancel_requested
            );
        }
        BulkAction::Retry => println!("retried {} dead task(s)", outcome.changed),
        BulkAction::Reprioritise(p) => {
            details["priority"] = p.get().into();
            println!("set priority {} on {} task(s)", p.get(), outcome.changed);
        }
    }
    if outcome.changed + outcome.cancel_requested >= u64::from(args.limit) {
        println!(
            "the limit ({}) was reached: more tasks may match",
            args.limit
        );
    }
    crate::audit::record(client, name, &summary(&filter), details).await
}
