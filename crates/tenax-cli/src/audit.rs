//! `tenax audit list`, and the audit entry every acting command records.
use anyhow::Context;
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::{AuditAppendParams, AuditListParams};
use tenax::Client;

/// Who acts from the command line: `cli:<os user>` (from `$USER`), or `cli:unknown`.
pub(crate) fn actor() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    format!("cli:{user}")
}

/// Record an operator action that has just been done.
pub(crate) async fn record(
    client: &Client,
    action: &str,
    target: &str,
    details: serde_json::Value,
) -> anyhow::Result<()> {
    client
        .storage()
        .audit_append(&AuditAppendParams {
            actor: actor(),
            action: action.to_owned(),
            target: target.to_owned(),
            details,
            now: None,
        })
        .await
        .with_context(|| {
            format!("{action} on {target} was done, but its audit entry was not recorded")
        })?;
    Ok(())
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditCommand {
    /// Recorded operator actions (cancels, retries, bulk actions, schedule and queue
    /// changes), newest first.
    List(AuditListArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AuditListArgs {
    /// Only this actor (for example cli:alice).
    #[arg(long)]
    actor: Option<String>,
    /// Only this action (for example task.cancel or tasks.bulk_retry).
    #[arg(long)]
    action: Option<String>,
    /// Only entries older than this entry id (the next page).
    #[arg(long, value_name = "ID")]
    before: Option<i64>,
    /// At most this many (1-1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(client: &Client, command: AuditCommand) -> anyhow::Result<()> {
    match command {
        AuditCommand::List(args) => list(client, args).await,
    }
}

/// `tenax audit list`: recorded operator actions, newest first.
async fn list(client: &Client, args: AuditListArgs) -> anyhow::Result<()> {
    let entries = client
        .audit(&AuditListParams {
            before_id: args.before,
            limit: args.limit,
            actor: args.actor,
            action: args.action,
        })
        .await?;
    if args.json {
        for entry in &entries {
            println!("{}", serde_json::to_string(entry)?);
        }
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header(["id", "at (UTC)", "actor", "action", "target", "details"]);
    for e in &entries {
        table.add_row([
            e.id.to_string(),
            e.at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            e.actor.clone(),
            e.action.clone(),
            e.target.clone(),
            e.details.to_string(),
        ]);
    }
    println!("{table}");
    match entries.last() {
        Some(last) if entries.len() as u32 == args.limit => println!(
            "{} entr(ies); older ones: --before {}",
            entries.len(),
            last.id
        ),
        _ => println!("{} entr(ies)", entries.len()),
    }
    Ok(())
}
