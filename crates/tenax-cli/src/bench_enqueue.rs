//! `tenax bench enqueue`: how many tasks per second enter the store one at a time
//! (one transaction each) and in bulk (`Client::enqueue_many`, one transaction per
//! batch), on a database of the run's own; and, in the same run on PostgreSQL and
//! SQLite, the raw multi-row `INSERT` of the same columns in the same batches on the
//! same table and indexes, the baseline of the bulk figure.
use std::time::Instant;

use clap::Args;
use comfy_table::Table;
use tenax::Client;

use crate::bench_common::{bench_url, drop_bench_schema, progress_bar, BenchDb, Spread};

#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// Tasks to enqueue in bulk (and raw) in each run.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Tasks enqueued one by one in each run (0 to skip).
    #[arg(long, default_value_t = 2_000)]
    one_by_one: usize,
    /// Tasks per bulk call (and per raw INSERT).
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
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

/// One run's rates, tasks per second.
struct Run {
    one: Option<f64>,
    bulk: f64,
    raw: Option<f64>,
}

fn payload(i: usize) -> serde_json::Value {
    serde_json::json!({ "order": i, "note": "bench" })
}

async fn one_run(
    client: &Client,
    db: Option<&BenchDb>,
    args: &EnqueueArgs,
    run: usize,
) -> anyhow::Result<(Run, u64)> {
    let mut accounted = 0u64;
    let one = if args.one_by_one > 0 {
        let bar = progress_bar(args.one_by_one as u64, "one by one");
        let started = Instant::now();
        for i in 0..args.one_by_one {
            let outcome = client
                .enqueue_raw("NOOP", &payload(i))
                .task_no(format!("one-{run}-{i}"))
                .await?;
            accounted += u64::from(outcome.created);
            bar.inc(1);
        }
        bar.finish_and_clear();
        Some(args.one_by_one as f64 / started.elapsed().as_secs_f64())
    } else {
        None
    };

    let bar = progress_bar(args.tasks as u64, "bulk");
    let started = Instant::now();
    for start in (0..args.tasks).step_by(args.batch) {
        let end = (start + args.batch).min(args.tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|i| {
                client
                    .enqueue_raw("NOOP", &payload(i))
                    .task_no(format!("bulk-{run}-{i}"))
            }))
            .await?;
        accounted += outcomes.iter().filter(|o| o.created()).count() as u64;
        bar.set_position(end as u64);
    }
    let bulk = args.tasks as f64 / started.elapsed().as_secs_f64();
    bar.finish_and_clear();

    let raw = match db {
        Some(db) => Some(
            db.raw_insert_rate(args.tasks as u64, args.batch as u64, &format!("raw-{run}-"))
                .await?,
        ),
        None => None,
    };
    if let Some(db) = db {
        let window = db.window(0).await?;
        let raw_rows = if raw.is_some() { args.tasks as u64 } else { 0 };
        if window.other != accounted + raw_rows {
            anyhow::bail!(
                "the table holds {} tasks, {} expected",
                window.other,
                accounted + raw_rows
            );
        }
        db.reset().await?;
    }
    Ok((Run { one, bulk, raw }, accounted))
}

pub(crate) async fn enqueue(database_url: &str, args: EnqueueArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.batch == 0 || args.runs == 0 {
        anyhow::bail!("--tasks, --batch and --runs must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let db = BenchDb::connect(&url).await.ok();
    let mut runs = Vec::new();
    let mut accounted = 0;
    for run in 0..args.runs {
        let (figures, created) = one_run(&client, db.as_ref(), &args, run).await?;
        if created != (args.tasks + args.one_by_one) as u64 {
            anyhow::bail!("run {run} created {created} tasks");
        }
        accounted += created;
        runs.push(figures);
    }
    drop(db);
    let backend = client.storage().backend();
    drop(client);
    drop_bench_schema(database_url, args.keep).await?;

    let spread = |f: &dyn Fn(&Run) -> Option<f64>| -> Option<Spread> {
        let values: Vec<f64> = runs.iter().filter_map(f).collect();
        (!values.is_empty()).then(|| Spread::of(&values))
    };
    let one = spread(&|r| r.one);
    let bulk = spread(&|r| Some(r.bulk));
    let raw = spread(&|r| r.raw);
    let ratio = spread(&|r| r.raw.map(|raw| r.bulk / raw));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "enqueue", "backend": backend, "batch": args.batch,
                "tasks": args.tasks, "one_by_one_tasks": args.one_by_one, "runs": runs.len(),
                "one_by_one_per_s": one, "bulk_per_s": bulk, "raw_insert_per_s": raw,
                "bulk_to_raw": ratio, "accounted": accounted,
            })
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header([
        "backend",
        "mode",
        "tasks/s median (min–max)",
        "ratio to raw INSERT",
    ]);
    let show = |s: &Option<Spread>| s.map_or("-".to_owned(), |s| s.show());
    table.add_row([
        backend.to_owned(),
        "one by one".to_owned(),
        show(&one),
        "-".to_owned(),
    ]);
    table.add_row([
        backend.to_owned(),
        format!("bulk, batches of {}", args.batch),
        show(&bulk),
        ratio.map_or("-".to_owned(), |r| r.show_ratio()),
    ]);
    table.add_row([
        backend.to_owned(),
        "raw multi-row INSERT (baseline)".to_owned(),
        show(&raw),
        "1".to_owned(),
    ]);
    println!("enqueue rate, {} run(s):\n{table}", runs.len());
    Ok(())
}
