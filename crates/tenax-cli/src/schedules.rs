//! `tenax schedules ...`: periodic tasks.
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, SecondsFormat, Utc};
use clap::{Args, Subcommand};
use comfy_table::Table;
use tenax::storage::{ScheduleRecord, ScheduleUpserted};
use tenax::{Client, CommandDefaults, MissedTicks, Schedule};

use crate::parse_duration;

#[derive(Debug, Subcommand)]
pub(crate) enum SchedulesCommand {
    /// List schedules with their next fire time (UTC).
    List,
    /// Add a schedule, or update the one of the same name.
    Add(AddArgs),
    /// Pause a schedule: it fires nothing until resumed.
    Pause(NameArg),
    /// Resume a schedule from its first tick after now.
    Resume(NameArg),
    /// Remove a schedule (the tasks it enqueued stay).
    Remove(NameArg),
}

#[derive(Debug, Args)]
pub(crate) struct NameArg {
    /// The schedule's name.
    name: String,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("cadence").required(true).args(["cron", "every"])))]
pub(crate) struct AddArgs {
    /// Unique name (letters, digits, -, _ and .; at most 100 bytes).
    name: String,
    /// Command type each tick enqueues (for example NOOP).
    command_type: String,
    /// Payload (the command's context) as JSON.
    #[arg(default_value = "{}")]
    payload: String,
    /// Cron expression: 5 fields (minute hour day month weekday), or 6 with seconds
    /// first (for example "0 */5 * * * *").
    #[arg(long)]
    cron: Option<String>,
    /// Fixed interval, whole seconds (for example 30s, 1h); ticks at multiples of it
    /// since 1970-01-01 UTC.
    #[arg(long, value_parser = parse_duration)]
    every: Option<Duration>,
    /// IANA time zone the cron expression is read in (for example Europe/Paris)
    /// [default: UTC].
    #[arg(long, requires = "cron")]
    timezone: Option<String>,
    /// After an outage, fire the latest N missed ticks (1-1000) instead of skipping
    /// ticks later than the workers' `missed_tick_grace` (a minute by default).
    #[arg(long, value_name = "N")]
    catch_up: Option<u32>,
    /// Queue of the enqueued tasks.
    #[arg(long, default_value = CommandDefaults::STANDARD.queue)]
    queue: String,
    /// Priority 0-9 (9 most urgent).
    #[arg(long, default_value_t = CommandDefaults::STANDARD.priority)]
    priority: u8,
    /// Attempt budget of each task [default: the `max_attempts` of `[retry."TYPE"]` in
    /// tenax.toml, else 5].
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Per-attempt timeout of each task [default: 30m, `CommandDefaults::STANDARD`, as
    /// for every other way in].
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
}

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

fn describe(s: &ScheduleRecord) -> String {
    format!(
        "{} ({}, {} -> {}, next {})",
        s.def.name,
        s.def.cadence,
        s.def.missed,
        s.def.command_type,
        if s.paused {
            "paused".to_owned()
        } else {
            time(s.next_fire_at)
        }
    )
}

pub(crate) async fn run(
    client: &Client,
    command: SchedulesCommand,
    retry: &std::collections::BTreeMap<String, crate::config::CommandRetry>,
) -> anyhow::Result<()> {
    match command {
        SchedulesCommand::List => list(client).await,
        SchedulesCommand::Add(args) => add(client, args, retry).await,
        SchedulesCommand::Pause(NameArg { name }) => {
            let s = client.pause_schedule(&name).await?;
            println!("paused {}", describe(&s));
            crate::audit::record(client, "schedule.pause", &name, serde_json::Value::Null).await
        }
        SchedulesCommand::Resume(NameArg { name }) => {
            let s = client.resume_schedule(&name).await?;
            println!("resumed {}", describe(&s));
            crate::audit::record(client, "schedule.resume", &name, serde_json::Value::Null).await
        }
        SchedulesCommand::Remove(NameArg { name }) => {
            client.remove_schedule(&name).await?;
            println!("removed schedule {name:?}");
            crate::audit::record(client, "schedule.remove", &name, serde_json::Value::Null).await
        }
    }
}

async fn add(
    client: &Client,
    args: AddArgs,
    retry: &std::collections::BTreeMap<String, crate::config::CommandRetry>,
) -> anyhow::Result<()> {
    let payload: serde_json::Value =
        serde_json::from_str(&args.payload).context("the payload is not valid JSON")?;
    let mut schedule = match (&args.cron, args.every) {
        (Some(cron), _) => Schedule::cron(&args.name, cron),
        (None, Some(every)) => Schedule::every(&args.name, every),
        (None, None) => anyhow::bail!("give --cron EXPRESSION or --every DURATION"),
    };
    if let Some(timezone) = &args.timezone {
        schedule = schedule.timezone(timezone);
    }
    if let Some(n) = args.catch_up {
        schedule = schedule.missed(MissedTicks::CatchUp(n));
    }
    let schedule = schedule
        .command_raw(&args.command_type, &payload)
        .queue(args.queue)
        .priority(args.priority)
        .max_attempts(
            args.max_attempts
                .unwrap_or_else(|| crate::config::max_attempts_of(retry, &args.command_type)),
        )
        .timeout(args.timeout.unwrap_or(CommandDefaults::STANDARD.timeout));
    let (record, change) = client.upsert_schedule(schedule).await?;
    let verb = match change {
        ScheduleUpserted::Created => "added",
        ScheduleUpserted::Updated => "updated",
        ScheduleUpserted::Unchanged => "unchanged",
    };
    println!("{verb} {}", describe(&record));
    if change == ScheduleUpserted::Unchanged {
        return Ok(());
    }
    crate::audit::record(
        client,
        "schedule.add",
        &args.name,
        serde_json::json!({
            "change": verb,
            "command_type": args.command_type,
            "cron": args.cron,
            "every_secs": args.every.map(|d| d.as_secs()),
            "timezone": args.timezone,
        }),
    )
    .await
}

async fn list(client: &Client) -> anyhow::Result<()> {
    let schedules = client.schedules().await?;
    let mut table = Table::new();
    table.set_header([
        "name",
        "cadence",
        "missed ticks",
        "command",
        "queue",
        "state",
        "next fire (UTC)",
        "last tick (UTC)",
    ]);
    for s in &schedules {
        table.add_row([
            s.def.name.clone(),
            s.def.cadence.to_string(),
            s.def.missed.to_string(),
            s.def.command_type.clone(),
            s.def.queue.clone(),
            if s.paused { "paused" } else { "active" }.to_owned(),
            if s.paused {
                "-".to_owned()
            } else {
                time(s.next_fire_at)
            },
            time(s.last_tick),
        ]);
    }
    println!("{table}");
    println!("{} schedule(s)", schedules.len());
    Ok(())
}
