//! Worker processes killed with SIGKILL at random moments while 2,000 transactional
//! postings drain: the ledger ends with exactly one row per task. On SQLite,
//! PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use example_ledger::{Backend, Enqueued, Entry};
use rand::Rng;
use tenax::{Client, TaskStatus};

const TASKS: usize = 2_000;
const KILLS: usize = 50;

/// One kill loop at a time: each starts and kills a hundred processes, and its kills
/// must land while the tasks drain, not while a neighbour's loop hogs the cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A worker process with a 1 s lease that stays `hold_ms` inside each transaction.
fn spawn_worker(url: &str, hold_ms: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_example-ledger"))
        .args(["worker", url, "1000", &hold_ms.to_string()])
        .env("RUST_LOG", "off")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the ledger worker")
}

async fn succeeded(client: &Client) -> u64 {
    client.stats().await.unwrap().count(TaskStatus::Succeeded)
}

async fn kill_loop(backend: &str, hold_ms: u64) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Some((url, _guard)) = common::fresh(backend).await else {
        return;
    };
    let ledger = Backend::open(&url).await.unwrap();
    let client = Client::new(ledger.storage());
    let postings = (0..TASKS).map(|i| {
        let entry = Entry {
            account: format!("acct-{}", i % 37),
            amount_cents: i as i64 + 1,
        };
        client
            .enqueue::<Enqueued>(entry)
            .task_no(format!("POST-{i}"))
    });
    client.enqueue_many(postings).await.unwrap();

    let started = Instant::now();
    let mut kills = 0;
    while kills < KILLS {
        let mut worker = spawn_worker(&url, hold_ms);
        let alive = rand::rng().random_range(100..=300);
        tokio::time::sleep(Duration::from_millis(alive)).await;
        worker.kill().unwrap(); // SIGKILL
        worker.wait().unwrap();
        kills += 1;
    }
    let done_while_killing = succeeded(&client).await;

    let mut last = spawn_worker(&url, hold_ms);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if succeeded(&client).await == TASKS as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: only {} of {TASKS} tasks succeeded",
            succeeded(&client).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last.kill().unwrap();
    last.wait().unwrap();

    let rows = ledger.ledger().await.unwrap();
    let mut numbers: Vec<&str> = rows.iter().map(|(no, _)| no.as_str()).collect();
    numbers.sort_unstable();
    numbers.dedup();
    let repeated = common::count(
        &ledger,
        "SELECT COUNT(*) FROM tenax_tasks WHERE attempt > 1",
    )
    .await;
    // Each row was written by the attempt that completed its task.
    let mismatched = common::count(
        &ledger,
        "SELECT COUNT(*) FROM ledger_entries l JOIN tenax_tasks t ON t.task_no = l.task_no
         WHERE t.status <> 'succeeded' OR t.lease_epoch <> l.epoch",
    )
    .await;
    println!(
        "{backend}: {kills} kills, {done_while_killing} tasks done while killing, \
         {repeated} tasks ran more than one attempt, {} ledger rows for {} task numbers, \
         {:.1} s",
        rows.len(),
        numbers.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(kills >= KILLS);
    assert!(
        done_while_killing > 0 && done_while_killing < TASKS as u64,
        "the kills must land while the tasks drain ({done_while_killing} done)"
    );
    assert_eq!(rows.len(), TASKS, "{backend}: one ledger row per task");
    assert_eq!(numbers.len(), TASKS, "{backend}: every task has its row");
    assert_eq!(mismatched, 0, "{backend}: rows written by a stale attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_kill_loop_posts_each_entry_once() {
    kill_loop("sqlite", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_kill_loop_posts_each_entry_once() {
    kill_loop("postgres", 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_kill_loop_posts_each_entry_once() {
    kill_loop("mysql", 20).await;
}
