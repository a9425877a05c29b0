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

/// The default burst: one second's worth of tokens, at least 1.
fn default_burst(per_second: f64) -> u32 {
    if per_second.is_finite() && per_second > 1.0 {
        per_second.ceil().min(f64::from(u32::MAX)) as u32
    } else {
        1
    }
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
            let burst = args.burst.unwrap_or_else(|| default_burst(args.per_second));
            print_one(
                &client
                    .set_rate_limit(&args.command_type, args.per_second, burst)
                    .await?,
            );
        }
        RateLimitsCommand::Remove { command_type } => {
            client.remove_rate_limit(&command_type).await?;
            println!("rate limit {command_type} removed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_burst_is_one_second_of_tokens() {
        assert_eq!(super::default_burst(0.5), 1);
        assert_eq!(super::default_burst(20.0), 20);
        assert_eq!(super::default_burst(2.5), 3);
        assert_eq!(super::default_burst(f64::NAN), 1);
    }
}
