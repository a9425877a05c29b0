//! `tenax rate-limits ...`: list, set and remove rate limits per command type.
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::RateLimit;
use tenax::Client;

#[derive(Debug, Subcommand)]
pub(crate) enum RateLimitsCommand {
    /// List the rate limits per command type.
    List,
    /// Limit how fast tasks of a command type start across all nodes.
    Set(SetArgs),
    /// Remove a command type's rate limit.
    Remove {
        /// Command type.
        command_type: String,
    },
}

#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    /// Command type.
    command_type: String,
    /// Tasks started per second in the long run (above 0, at most 1000000).
    #[arg(long, value_name = "R")]
    per_second: f64,
    /// Tasks that may start at once after a quiet spell (1..=1000000; default: the rate
    /// rounded up).
    #[arg(long, value_name = "B")]
    burst: Option<u32>,
}

fn print_one(limit: &RateLimit) {
    println!(
        "rate limit {}: {}/s, burst {}",
        limit.command_type, limit.per_second, limit.burst
    );
}

pub(crate) async fn run(client: &Client, command: RateLimitsCommand) -> anyhow::Result<()> {
    match command {
        RateLimitsCommand::List => {
            let limits = client.rate_limits().await?;
            let mut table = Table::new();
            table.set_header(["command type", "per second", "burst"]);
            for l in &limits {
                table.add_row([
                    l.command_type.clone(),
                    l.per_second.to_string(),
                    l.burst.to_string(),
                ]);
            }
            println!("{table}");
            println!("{} rate limit(s)", limits.len());
        }
        RateLimitsCommand::Set(args) => {
            let burst = args
                .burst
                .unwrap_or_else(|| tenax::storage::RateLimit::default_burst(args.per_second));
            let stored = client
                .set_rate_limit(&args.command_type, args.per_second, burst)
                .await?;
            print_one(&stored);
            crate::audit::record(
                client,
                "rate_limit.set",
                &stored.command_type,
                serde_json::json!({ "per_second": stored.per_second, "burst": stored.burst }),
            )
            .await?;
        }
        RateLimitsCommand::Remove { command_type } => {
            client.remove_rate_limit(&command_type).await?;
            println!("rate limit {command_type} removed");
            crate::audit::record(
                client,
                "rate_limit.remove",
                &command_type,
                serde_json::json!({}),
            )
            .await?;
        }
    }
    Ok(())
}
