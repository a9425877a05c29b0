//! `tenax queues ...`: list, pause, resume and limit queues.
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::QueueInfo;
use tenax::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum QueuesCommand {
    /// List queues with waiting and running tasks, paused state and limit.
    List,
    /// Stop claiming from a queue on every node (running tasks finish).
    Pause {
        /// Queue name.
        name: String,
    },
    /// Claim from a paused queue again.
    Resume {
        /// Queue name.
        name: String,
    },
    /// Limit how many tasks of a queue run at once across all nodes.
    Limit(LimitArgs),
}

#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// Queue name.
    name: String,
    /// At most this many running at once (at least 1).
    #[arg(
        long,
        value_name = "N",
        required_unless_present = "unlimited",
        conflicts_with = "unlimited"
    )]
    max_running: Option<u32>,
    /// Remove the limit.
    #[arg(long)]
    unlimited: bool,
}

fn limit_text(info: &QueueInfo) -> String {
    info.max_running
        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string())
}

fn print_one(info: &QueueInfo) {
    println!(
        "queue {}: {}, limit {}, {} waiting, {} running",
        info.name,
        if info.paused { "paused" } else { "active" },
        limit_text(info),
        info.waiting,
        info.running
    );
}

pub(crate) async fn run(client: &Client, command: QueuesCommand) -> anyhow::Result<()> {
    match command {
        QueuesCommand::List => {
            let queues = client.queues().await?;
            let mut table = Table::new();
            table.set_header(["queue", "pending", "running", "paused", "limit"]);
            for q in &queues {
                table.add_row([
                    q.name.clone(),
                    q.waiting.to_string(),
                    q.running.to_string(),
                    if q.paused { "yes" } else { "no" }.to_owned(),
                    limit_text(q),
                ]);
            }
            println!("{table}");
            println!("{} queue(s)", queues.len());
        }
        QueuesCommand::Pause { name } => {
            print_one(&client.pause_queue(&name).await?);
            crate::audit::record(client, "queue.pause", &name, serde_json::Value::Null).await?;
        }
        QueuesCommand::Resume { name } => {
            print_one(&client.resume_queue(&name).await?);
            crate::audit::record(client, "queue.resume", &name, serde_json::Value::Null).await?;
        }
        QueuesCommand::Limit(args) => {
            let max = if args.unlimited {
                None
            } else {
                args.max_running
            };
            print_one(&client.set_queue_limit(&args.name, max).await?);
            crate::audit::record(
                client,
                "queue.limit",
                &args.name,
                serde_json::json!({ "max_running": max }),
            )
            .await?;
        }
    }
    Ok(())
}
