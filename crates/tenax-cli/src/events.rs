//! `tenax events ...`: which tasks write task events, and where the stream stands.
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::EventListParams;
use tenax::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// Tasks inserted from now on in this queue and/or of this command type write task
    /// events (without either: every task).
    On(RuleArgs),
    /// Remove a rule added with `events on` (tasks already inserted keep writing).
    Off(RuleArgs),
    /// The rules, and the stream's head and pruned position.
    Status,
}

#[derive(Debug, Args)]
pub(crate) struct RuleArgs {
    /// Only tasks of this queue.
    #[arg(long, value_name = "QUEUE")]
    queue: Option<String>,
    /// Only tasks of this command type.
    #[arg(long = "type", value_name = "TYPE")]
    command_type: Option<String>,
}

impl RuleArgs {
    /// The audit entry's details, as the HTTP API records them.
    fn details(&self) -> serde_json::Value {
        serde_json::json!({"queue": self.queue, "command_type": self.command_type})
    }
}

fn shown(value: Option<&str>) -> &str {
    value.unwrap_or("(any)")
}

pub(crate) async fn run(client: &Client, command: EventsCommand) -> anyhow::Result<()> {
    let storage = client.storage();
    match command {
        EventsCommand::On(args) => {
            let changed = client
                .events_on(args.queue.as_deref(), args.command_type.as_deref())
                .await?;
            if changed {
                crate::audit::record(client, "events.rule_on", "event_rules", args.details())
                    .await?;
            }
            println!(
                "events {} for queue {} and type {}",
                if changed { "on" } else { "were already on" },
                shown(args.queue.as_deref()),
                shown(args.command_type.as_deref())
            );
            Ok(())
        }
        EventsCommand::Off(args) => {
            let changed = client
                .events_off(args.queue.as_deref(), args.command_type.as_deref())
                .await?;
            if !changed {
                anyhow::bail!(
                    "no rule for queue {} and type {}",
                    shown(args.queue.as_deref()),
                    shown(args.command_type.as_deref())
                );
            }
            crate::audit::record(client, "events.rule_off", "event_rules", args.details()).await?;
            println!(
                "events off for queue {} and type {} (for tasks inserted from now on)",
                shown(args.queue.as_deref()),
                shown(args.command_type.as_deref())
            );
            Ok(())
        }
        EventsCommand::Status => {
            let rules = client.event_rules().await?;
            let mut table = Table::new();
            table.set_header(["queue", "type", "since"]);
            for rule in &rules {
                table.add_row([
                    shown(rule.queue.as_deref()).to_owned(),
                    shown(rule.command_type.as_deref()).to_owned(),
                    rule.created_at.to_rfc3339(),
                ]);
            }
            if rules.is_empty() {
                println!("no event rules: no task writes events");
            } else {
                println!("{table}");
            }
            let page = storage
                .event_list(&EventListParams {
                    after: 0,
                    limit: 1,
                    ..Default::default()
                })
                .await?;
            println!(
                "stream head {}, pruned through {}",
                page.head, page.pruned_through
            );
            Ok(())
        }
    }
}
