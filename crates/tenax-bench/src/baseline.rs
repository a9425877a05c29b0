//! `tenax bench baseline`: the database's own limits for Tenax's workload, on Tenax's
//! table and indexes, writing the columns Tenax writes: the raw claim+complete drain in
//! batches (the baseline of `drain`), the raw insert+claim+complete life cycle (of
//! `steady`, PostgreSQL) and the raw multi-row insert (of bulk `enqueue`). The other
//! subcommands run the baseline of their own figure in the same run; this one shows
//! all three side by side.
use std::time::Duration;

use clap::Args;
use comfy_table::Table;
use tenax::Client;

use crate::common::parse_duration;
use crate::common::{bench_url, drop_bench_schema, BenchDb, Spread};

#[derive(Debug, Args)]
pub struct BaselineArgs {
    /// Tasks inserted and drained in each run.
    #[arg(long, default_value_t = 20_000)]
    tasks: u64,
    /// Batch of the inserts, claims and completions.
    #[arg(long, default_value_t = 100)]
    batch: u32,
    /// Concurrent clients of the drain and life-cycle baselines.
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Length of the life-cycle baseline.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    lifecycle_time: Duration,
    /// Runs; the median and min–max are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Keep the bench schema afterwards (PostgreSQL).
    #[arg(long)]
    keep: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn baseline(database_url: &str, args: BaselineArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.batch == 0 || args.runs == 0 {
        anyhow::bail!("--tasks, --batch and --runs must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    // Connecting a client migrates the run's database.
    let client = Client::connect(&url).await?;
    let backend = client.storage().backend();
    let db = BenchDb::connect(&url).await?;
    let (mut insert, mut drain, mut life) = (Vec::new(), Vec::new(), Vec::new());
    let mut accounted = 0u64;
    for run in 0..args.runs {
        db.reset().await?;
        insert.push(
            db.raw_insert_rate(args.tasks, u64::from(args.batch), &format!("raw-{run}-"))
                .await?,
        );
        let done = db.raw_drain(args.clients, args.batch).await?;
        let window = db.window(0).await?;
        if done != args.tasks || window.succeeded != args.tasks || window.other != 0 {
            anyhow::bail!("the drain baseline finished {done} of {} tasks", args.tasks);
        }
        accounted += done;
        drain.push(window.succeeded as f64 / window.seconds().max(1e-6));
        db.reset().await?;
        if let Some(rate) = db
            .raw_lifecycle(args.clients, args.batch, args.lifecycle_time)
            .await?
        {
            life.push(rate);
        }
    }
    db.reset().await?;
    drop(db);
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;
    let (insert, drain) = (Spread::of(&insert), Spread::of(&drain));
    let life = (!life.is_empty()).then(|| Spread::of(&life));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "baseline", "backend": backend, "tasks": args.tasks,
                "batch": args.batch, "clients": args.clients, "runs": args.runs,
                "raw_insert_per_s": insert, "claim_complete_per_s": drain,
                "lifecycle_per_s": life, "accounted": accounted,
            })
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header(["backend", "raw SQL", "rows/s median (min–max)"]);
    table.add_row([
        backend.to_owned(),
        format!("multi-row INSERT, batches of {}", args.batch),
        insert.show(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!(
            "claim+complete, batches of {}, {} client(s)",
            args.batch, args.clients
        ),
        drain.show(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!(
            "insert+claim+complete life cycle, {} client(s)",
            args.clients
        ),
        life.map_or("-".to_owned(), |l| l.show()),
    ]);
    println!("the database's own limits on Tenax's table:\n{table}");
    Ok(())
}
