//! Post ledger entries exactly once through transactional completion.
//!
//! - `cargo run -p example-ledger`: post 20 entries into a fresh SQLite file, run a
//!   worker until all are done, and check the ledger holds one row per task;
//! - `cargo run -p example-ledger -- worker URL [LEASE_MS] [HOLD_MS]`: only run a
//!   worker on `URL` until stopped (the crash tests kill it with SIGKILL), with a lease
//!   of `LEASE_MS` (default 30000) and `HOLD_MS` spent inside each transaction.
use std::time::Duration;

use example_ledger::{Backend, BoxError, Enqueued, Entry, PostEntry};
use tenax::storage::{TaskListParams, TaskRef};
use tenax::{Client, TaskStatus, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// A worker configuration around a lease of `lease`: heartbeats and fence margin a
/// quarter of it, the reaper twice per lease.
fn config(lease: Duration) -> WorkerConfig {
    WorkerConfig {
        lease_ttl: lease,
        heartbeat_interval: lease / 4,
        fence_margin: lease / 4,
        reaper_interval: lease / 2,
        poll_interval: Duration::from_millis(50).min(lease / 4),
        ..WorkerConfig::default()
    }
}

fn millis(arg: Option<&String>, default: u64) -> Result<Duration, BoxError> {
    match arg {
        Some(text) => {
            Ok(Duration::from_millis(text.parse().map_err(|e| {
                format!("{text:?} is not a number of milliseconds: {e}")
            })?))
        }
        None => Ok(Duration::from_millis(default)),
    }
}

async fn worker(args: &[String]) -> Result<(), BoxError> {
    let url = args
        .first()
        .ok_or("usage: example-ledger worker URL [LEASE_MS] [HOLD_MS]")?;
    let lease = millis(args.get(1), 30_000)?;
    let hold = millis(args.get(2), 0)?;
    let backend = Backend::open(url).await?;
    let worker = Worker::new(
        backend.storage(),
        backend.registry(PostEntry { hold })?,
        config(lease),
    )?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    tokio::signal::ctrl_c().await?;
    stop.cancel();
    running.await??;
    Ok(())
}

async fn demo() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("tenax-ledger-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let backend = Backend::open(&url).await?;
    let client = Client::new(backend.storage());
    let accounts = ["ada", "grace", "edsger", "barbara"];
    let postings = (0..20i64).map(|i| {
        let entry = Entry {
            account: accounts[i as usize % accounts.len()].to_owned(),
            amount_cents: 100 * (i + 1),
        };
        client
            .enqueue::<Enqueued>(entry)
            .task_no(format!("POST-{i}"))
    });
    client.enqueue_many(postings).await?;

    let worker = Worker::new(
        backend.storage(),
        backend.registry(PostEntry::default())?,
        config(Duration::from_secs(30)),
    )?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let done = loop {
        let done = client
            .list(&TaskListParams {
                status: Some(TaskStatus::Succeeded),
                limit: 100,
                ..TaskListParams::default()
            })
            .await?;
        if done.len() == 20 {
            break done;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("only {} of 20 postings done within 60 s", done.len()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    stop.cancel();
    running.await??;

    let rows = backend.ledger().await?;
    for task in done.iter().take(4) {
        let last = client.get(&TaskRef::Id(task.id)).await?;
        if let Some(last) = last {
            println!(
                "{}: balance after posting {}",
                last.task_no,
                last.result.unwrap_or_default()
            );
        }
    }
    println!("{} tasks succeeded, {} ledger rows", done.len(), rows.len());
    if rows.len() != done.len() {
        return Err("the ledger does not hold one row per task".into());
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("worker") => worker(&args[1..]).await,
        None => demo().await,
        Some(other) => Err(format!("unknown command {other:?}; try `worker URL`").into()),
    }
}
