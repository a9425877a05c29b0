//! `tenax bench scale`: the drain of `--pending` tasks with `--finished` succeeded rows
//! already in the table, against the drain of the same pending tasks from an otherwise
//! empty table, side by side in each run. Both tables are filled with the backend's raw
//! multi-row insert (the enqueue path is not what this measures).
use clap::Args;
use comfy_table::Table;
use tenax::Client;

use crate::common::{bench_url, drop_bench_schema, BenchDb, Spread};
use crate::drain::{drain_with_workers, DrainSetup};

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Succeeded rows already in the table.
    #[arg(long, default_value_t = 1_000_000)]
    finished: u64,
    /// Pending tasks to drain.
    #[arg(long, default_value_t = 100_000)]
    pending: u64,
    /// Print the plan of Tenax's claim of --concurrency tasks from the full table
    /// (`EXPLAIN ANALYZE`, rolled back) to stderr, once (PostgreSQL).
    #[arg(long)]
    explain: bool,
    #[command(flatten)]
    drain: DrainSetup,
}

pub(crate) async fn scale(database_url: &str, args: ScaleArgs) -> anyhow::Result<()> {
    let drain = &args.drain;
    if args.pending == 0 || drain.runs == 0 || drain.concurrency == 0 {
        anyhow::bail!("--pending, --runs and --concurrency must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let db = BenchDb::connect(&url).await?;
    let (mut empty, mut full) = (Vec::new(), Vec::new());
    for run in 0..drain.runs {
        db.reset().await?;
        db.raw_insert(args.pending, 10_000, &format!("empty-{run}-"), false)
            .await?;
        empty.push(drain_with_workers(&url, &client, &db, drain, 0, args.pending).await?);

        db.reset().await?;
        db.raw_insert(args.finished, 50_000, &format!("done-{run}-"), true)
            .await?;
        let since_id = db.max_id().await?;
        db.raw_insert(args.pending, 10_000, &format!("full-{run}-"), false)
            .await?;
        if args.explain && run == 0 {
            if let Some(plan) = db.explain_claim(drain.concurrency).await? {
                eprintln!("the claim with {} finished rows:\n{plan}", args.finished);
            }
        }
        full.push(drain_with_workers(&url, &client, &db, drain, since_id, args.pending).await?);
        let window = db.window(0).await?;
        if window.succeeded != args.finished + args.pending || window.other != 0 {
            anyhow::bail!(
                "the full table holds {} succeeded and {} other tasks",
                window.succeeded,
                window.other
            );
        }
    }
    drop(db);
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, drain.keep).await?;
    let ratios: Vec<f64> = full.iter().zip(&empty).map(|(f, e)| f / e).collect();
    let (empty, full, ratio) = (Spread::of(&empty), Spread::of(&full), Spread::of(&ratios));
    if drain.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "scale", "backend": backend, "finished": args.finished,
                "pending": args.pending, "workers": drain.workers,
                "concurrency": drain.concurrency, "runs": ratios.len(),
                "empty_per_s": empty, "full_per_s": full, "ratio": ratio,
                "accounted": (args.finished + 2 * args.pending) * ratios.len() as u64,
            })
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header([
        "backend",
        "table",
        "tasks/s median (min–max)",
        "ratio to empty",
    ]);
    table.add_row([
        backend.to_owned(),
        "empty".to_owned(),
        empty.show(),
        "1".to_owned(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!("{} finished rows", args.finished),
        full.show(),
        ratio.show_ratio(),
    ]);
    println!(
        "drain of {} pending tasks, {} worker(s) × {}:\n{table}",
        args.pending, drain.workers, drain.concurrency
    );
    Ok(())
}
