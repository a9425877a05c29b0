//! `tenax bench enqueue`: how many tasks per second enter the store one at a time
//! (one transaction each) and in bulk (`Client::enqueue_many`, one transaction per
//! batch), on a database of the run's own.
use std::time::Instant;

use clap::Args;
use comfy_table::Table;
use tenax::Client;

use crate::bench::bench_url;

#[derive(Debug, Args)]
pub(crate) struct EnqueueArgs {
    /// Tasks to enqueue in each mode.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Tasks per bulk call.
    #[arg(long, default_value_t = 10_000)]
    batch: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// One mode's figure: tasks, seconds, tasks per second.
struct Figure {
    mode: &'static str,
    tasks: usize,
    seconds: f64,
}

impl Figure {
    fn rate(&self) -> f64 {
        self.tasks as f64 / self.seconds
    }
}

pub(crate) async fn enqueue(database_url: &str, args: EnqueueArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.batch == 0 {
        anyhow::bail!("--tasks and --batch must be positive");
    }
    let (url, _dir) = bench_url(database_url).await?;
    let client = Client::connect(&url).await?;
    let payload = |i: usize| serde_json::json!({ "order": i, "note": "bench" });

    let started = Instant::now();
    for i in 0..args.tasks {
        client
            .enqueue_raw("NOOP", &payload(i))
            .task_no(format!("one-{i}"))
            .await?;
    }
    let one = Figure {
        mode: "one by one",
        tasks: args.tasks,
        seconds: started.elapsed().as_secs_f64(),
    };

    let started = Instant::now();
    let mut created = 0;
    for start in (0..args.tasks).step_by(args.batch) {
        let end = (start + args.batch).min(args.tasks);
        let outcomes = client
            .enqueue_many((start..end).map(|i| {
                client
                    .enqueue_raw("NOOP", &payload(i))
                    .task_no(format!("bulk-{i}"))
            }))
            .await?;
        created += outcomes.iter().filter(|o| o.created()).count();
    }
    let bulk = Figure {
        mode: "bulk",
        tasks: args.tasks,
        seconds: started.elapsed().as_secs_f64(),
    };
    if created != args.tasks {
        anyhow::bail!("bulk enqueue created {created} of {} tasks", args.tasks);
    }

    let backend = client.storage().backend();
    let speedup = bulk.rate() / one.rate();
    if args.json {
        let figure = |f: &Figure| serde_json::json!({"tasks": f.tasks, "seconds": f.seconds, "tasks_per_s": f.rate()});
        println!(
            "{}",
            serde_json::json!({
                "bench": "enqueue", "backend": backend, "batch": args.batch,
                "one_by_one": figure(&one), "bulk": figure(&bulk), "speedup": speedup,
            })
        );
    } else {
        let mut table = Table::new();
        table.set_header(["backend", "mode", "tasks", "seconds", "tasks/s"]);
        for f in [&one, &bulk] {
            table.add_row([
                backend.to_owned(),
                f.mode.to_owned(),
                f.tasks.to_string(),
                format!("{:.3}", f.seconds),
                format!("{:.0}", f.rate()),
            ]);
        }
        println!(
            "enqueue rate (bulk batches of {}; {speedup:.1}x one by one):\n{table}",
            args.batch
        );
    }
    Ok(())
}
