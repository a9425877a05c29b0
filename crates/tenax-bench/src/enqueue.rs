//! `tenax bench enqueue`: how many tasks per second enter the store one at a time
//! (one transaction each) and in bulk (`Client::enqueue_many`, one transaction per
//! batch), on a database of the run's own; and, in the same run on PostgreSQL and
//! SQLite, the raw multi-row `INSERT` of the same columns in the same batches on the
//! same table and indexes, the baselines of the bulk figure: on both, rows the
//! database makes itself (nothing sent per row); on PostgreSQL also rows sent from
//! the client, every value a parameter, as a hand-written queue would send them.
//! The bulk run and the baselines take turns going first, since a later one inserts
//! into a fuller table.
use std::time::Instant;

use clap::Args;
use comfy_table::Table;
use tenax::{Client, Command, CommandError, TaskContext};

use crate::common::{bench_url, drop_bench_schema, progress_bar, BenchDb, Spread};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
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
    sent: Option<f64>,
}

/// The bulk-insert parts of a run, in the order run `r` takes them: `r` rotates it.
#[derive(Clone, Copy)]
enum Part {
    Bulk,
    Raw,
    Sent,
}

fn parts_in_turn(run: usize) -> [Part; 3] {
    let mut parts = [Part::Bulk, Part::Raw, Part::Sent];
    parts.rotate_left(run % 3);
    parts
}

/// The bench's task: type `NOOP` (what `tenax worker --command NOOP` runs), enqueued
/// as a Rust caller does, through a typed command whose context is serialized from a
/// struct. Its payload is the baselines' `{"order":i,"note":"bench"}`.
struct BenchNoop;

#[derive(serde::Serialize, serde::Deserialize)]
struct Order {
    order: usize,
    note: std::borrow::Cow<'static, str>,
}

impl Command for BenchNoop {
    const TYPE: &'static str = "NOOP";
    type Context = Order;
    type Output = ();

    async fn execute(&self, _ctx: Order, _task: &TaskContext) -> Result<(), CommandError> {
        Ok(())
    }
}

fn payload(i: usize) -> Order {
    Order {
        order: i,
        note: "bench".into(),
    }
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
                .enqueue::<BenchNoop>(payload(i))
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

    let (mut bulk, mut raw, mut sent) = (0.0, None, None);
    for part in parts_in_turn(run) {
        match (part, db) {
            (Part::Bulk, _) => {
                let (rate, created) = bulk_run(client, args, run).await?;
                bulk = rate;
                accounted += created;
            }
            (Part::Raw, Some(db)) => {
                let prefix = format!("raw-{run}-");
                raw = Some(
                    db.raw_insert_rate(args.tasks as u64, args.batch as u64, &prefix)
                        .await?,
                );
            }
            (Part::Sent, Some(db)) => {
                let prefix = format!("sent-{run}-");
                sent = db
                    .sent_insert_rate(args.tasks as u64, args.batch as u64, &prefix)
                    .await?;
            }
            (_, None) => {}
        }
    }
    if let Some(db) = db {
        let window = db.window(0).await?;
        let raw_rows = args.tasks as u64 * (u64::from(raw.is_some()) + u64::from(sent.is_some()));
        if window.other != accounted + raw_rows {
            anyhow::bail!(
                "the table holds {} tasks, {} expected",
                window.other,
                accounted + raw_rows
            );
        }
        db.reset().await?;
    }
    Ok((
        Run {
            one,
            bulk,
            raw,
            sent,
        },
        accounted,
    ))
}

/// The bulk part of a run: `Client::enqueue_many` in batches; returns its rate and
/// the tasks it created.
async fn bulk_run(client: &Client, args: &EnqueueArgs, run: usize) -> anyhow::Result<(f64, u64)> {
    let bar = progress_bar(args.tasks as u64, "bulk");
    let mut created = 0u64;
    let started = Instant::now();
    for start in (0..args.tasks).step_by(args.batch) {
        let end = (start + args.batch).min(args.tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|i| {
                client
                    .enqueue::<BenchNoop>(payload(i))
                    .task_no(format!("bulk-{run}-{i}"))
            }))
            .await?;
        created += outcomes.iter().filter(|o| o.created()).count() as u64;
        bar.set_position(end as u64);
    }
    let rate = args.tasks as f64 / started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    Ok((rate, created))
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
    let sent = spread(&|r| r.sent);
    let sent_ratio = spread(&|r| r.sent.map(|sent| r.bulk / sent));
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "bench": "enqueue", "backend": backend, "batch": args.batch,
                "tasks": args.tasks, "one_by_one_tasks": args.one_by_one, "runs": runs.len(),
                "one_by_one_per_s": one, "bulk_per_s": bulk, "raw_insert_per_s": raw,
                "bulk_to_raw": ratio, "sent_insert_per_s": sent, "bulk_to_sent": sent_ratio,
                "accounted": accounted,
            })
        );
        return Ok(());
    }
    let mut table = Table::new();
    table.set_header([
        "backend",
        "mode",
        "tasks/s median (min–max)",
        "bulk's ratio to it",
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
        "-".to_owned(),
    ]);
    let ratio_of = |r: &Option<Spread>| r.map_or("-".to_owned(), |r| r.show_ratio());
    table.add_row([
        backend.to_owned(),
        "raw multi-row INSERT, rows sent (baseline)".to_owned(),
        show(&sent),
        ratio_of(&sent_ratio),
    ]);
    table.add_row([
        backend.to_owned(),
        "raw multi-row INSERT, rows made by the database (baseline)".to_owned(),
        show(&raw),
        ratio_of(&ratio),
    ]);
    println!("enqueue rate, {} run(s):\n{table}", runs.len());
    Ok(())
}
