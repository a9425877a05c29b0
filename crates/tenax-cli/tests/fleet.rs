//! Many worker processes on one database: real `tenax worker` processes, checked
//! against the execution ledger. PostgreSQL and MariaDB run when their
//! `TENAX_TEST_*_URL` is set (CI sets both and requires them).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tenax::storage::TaskListParams;
use tenax::{Client, TaskStatus};
use tenax_ledger::Ledger;
use tenax_storage::testing::{unique_name, url_from_env};

mod support;
use support::{SpawnGuarded, Spawned};

/// A worker process; its warnings go to `worker-N.log` beside the ledger (see
/// [`worker_logs`]).
fn spawn_worker(url: &str, ledger: &Path, command: &str) -> Spawned {
    spawn_worker_with(url, ledger, command, "1ms", "default")
}

/// [`spawn_worker`] with the bank calls' mean latency and the queue it claims from.
fn spawn_worker_with(
    url: &str,
    ledger: &Path,
    command: &str,
    bank_latency: &str,
    queue: &str,
) -> Spawned {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, Ordering::SeqCst);
    let dir = ledger.parent().expect("the ledger is in a folder");
    let log = std::fs::File::create(dir.join(format!("worker-{n}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url, "worker", "--command", command])
        .args([
            "--concurrency",
            "10",
            "--poll-interval",
            "50ms",
            "--lease-ttl",
            "10s",
        ])
        .args(["--bank-failure-rate", "0", "--bank-latency", bank_latency])
        .args(["--queue", queue])
        .arg("--ledger")
        .arg(ledger)
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_guarded("tenax worker")
}

/// What the workers beside `ledger` logged.
fn worker_logs(ledger: &Path) -> String {
    let dir = ledger.parent().expect("the ledger is in a folder");
    let mut logs = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("worker-") && name.ends_with(".log") {
            logs.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    logs
}

/// Every task ran at least once and none twice at once (the contract); a task that ran
/// again did so because an outcome or a renewal waited past its lease, for a connection
/// of a saturated pool or for a database stalled by the machine's load, and its worker
/// logged the cause: the pool's time-out, or the statement that took over a second.
fn assert_at_least_once(report: &tenax_ledger::LedgerReport, n: usize, ledger: &Path) {
    assert!(report.is_clean(), "{:#?}", report.overlaps.first());
    assert_eq!(report.tasks, n, "no task lost");
    assert!(report.open.is_empty());
    let repeats = report.executions - n;
    if repeats > 0 {
        let logs = worker_logs(ledger);
        assert!(
            logs.contains("pool timed out") || logs.contains("slow statement"),
            "{repeats} executions repeated, and no worker logged a pool time-out or a stalled statement:\n{logs}"
        );
        eprintln!("{repeats} executions repeated after pool time-outs or stalled statements");
    }
}

fn stop(mut workers: Vec<Spawned>) {
    for worker in &mut workers {
        assert!(
            worker.try_wait().unwrap().is_none(),
            "a worker exited during the run"
        );
        worker.kill().unwrap();
        worker.wait().unwrap();
    }
}

/// A database of its own on the backend, or `None` (skip).
async fn fresh_database(backend: &str) -> Option<String> {
    match backend {
        "postgres" => {
            let url = url_from_env("TENAX_TEST_POSTGRES_URL")?;
            let separator = if url.contains('?') { '&' } else { '?' };
            Some(format!(
                "{url}{separator}schema={}",
                unique_name("tenax_fleet")
            ))
        }
        "mysql" => {
            let url = url_from_env("TENAX_TEST_MYSQL_URL")?;
            let name = unique_name("tenax_fleet");
            mysql_database(&url, &name).await;
            Some(tenax_storage::testing::with_database(&url, &name))
        }
        _ => None,
    }
}

async fn mysql_database(url: &str, name: &str) {
    tenax_storage::mysql::testing_database(url, name)
        .await
        .expect("create database");
}

async fn enqueue_many(client: &Client, command: &str, prefix: &str, n: usize) {
    let mut joins = Vec::new();
    for part in 0..8 {
        let client = client.clone();
        let (command, prefix) = (command.to_owned(), prefix.to_owned());
        joins.push(tokio::spawn(async move {
            for i in (part..n).step_by(8) {
                client
                    .enqueue_raw(&command, &serde_json::json!({"customer": format!("c{i}"), "id_card": "12345678901234567"}))
                    .task_no(format!("{prefix}-{i:05}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for join in joins {
        join.await.unwrap();
    }
}

async fn wait_succeeded(client: &Client, n: u64, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let done = client.stats().await.unwrap().count(TaskStatus::Succeeded);
        if done == n {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "only {done} of {n} tasks succeeded within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn four_workers_process_ten_thousand_tasks(backend: &str) {
    let Some(url) = fresh_database(backend).await else {
        return;
    };
    const N: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    enqueue_many(&client, "NOOP", "T", N).await;
    let workers: Vec<Spawned> = (0..4)
        .map(|_| spawn_worker(&url, &ledger_path, "NOOP"))
        .collect();
    let took = wait_succeeded(&client, N as u64, Duration::from_secs(240)).await;
    stop(workers);
    eprintln!(
        "{backend}: 4 worker processes ran {N} tasks in {:.1} s ({:.0} tasks/s)",
        took.as_secs_f64(),
        N as f64 / took.as_secs_f64()
    );
    let report = ledger.check().await.unwrap();
    assert_at_least_once(&report, N, &ledger_path);
    let pids: std::collections::HashSet<u32> = ledger
        .executions()
        .await
        .unwrap()
        .iter()
        .map(|e| e.pid)
        .collect();
    assert_eq!(pids.len(), 4, "all four processes took part");
    let stats = client.stats().await.unwrap();
    assert_eq!(stats.count(TaskStatus::Succeeded), N as u64);
    assert_eq!(stats.total(), N as u64);
}

async fn a_mixed_fleet_runs_each_type_only_where_it_is_known(backend: &str) {
    let Some(url) = fresh_database(backend).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    enqueue_many(&client, "NOOP", "noop", 200).await;
    enqueue_many(&client, "BANK_OPEN_ACCOUNT", "bank", 200).await;
    let noop_worker = spawn_worker(&url, &ledger_path, "NOOP");
    let bank_worker = spawn_worker(&url, &ledger_path, "BANK_OPEN_ACCOUNT");
    let (noop_pid, bank_pid) = (noop_worker.id(), bank_worker.id());
    wait_succeeded(&client, 400, Duration::from_secs(120)).await;
    stop(vec![noop_worker, bank_worker]);
    let mut by_pid: HashMap<u32, usize> = HashMap::new();
    for execution in ledger.executions().await.unwrap() {
        let expected = if execution.task_no.starts_with("noop") {
            noop_pid
        } else {
            bank_pid
        };
        assert_eq!(
            execution.pid, expected,
            "{} ran on the wrong worker",
            execution.task_no
        );
        *by_pid.entry(execution.pid).or_default() += 1;
    }
    assert_eq!(by_pid.get(&noop_pid), Some(&200));
    assert_eq!(by_pid.get(&bank_pid), Some(&200));
    assert!(ledger.check().await.unwrap().is_clean());
    let all = client
        .list(&TaskListParams {
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(all
        .iter()
        .all(|t| t.status == TaskStatus::Succeeded && t.attempt == 1));
}

async fn four_workers_never_run_two_tasks_of_one_key_at_once(backend: &str) {
    let Some(url) = fresh_database(backend).await else {
        return;
    };
    const N: usize = 1_000;
    const KEYS: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    let mut joins = Vec::new();
    for part in 0..8 {
        let client = client.clone();
        joins.push(tokio::spawn(async move {
            for i in (part..N).step_by(8) {
                client
                    .enqueue_raw(
                        "BANK_OPEN_ACCOUNT",
                        &serde_json::json!({"customer": format!("c{i}"), "id_card": "12345678901234567"}),
                    )
                    .task_no(format!("K-{i:05}"))
                    .concurrency_key(format!("customer-{}", i % KEYS))
                    .await
                    .unwrap();
            }
        }));
    }
    for join in joins {
        join.await.unwrap();
    }
    let workers: Vec<Spawned> = (0..4)
        .map(|_| spawn_worker(&url, &ledger_path, "BANK_OPEN_ACCOUNT"))
        .collect();
    let took = wait_succeeded(&client, N as u64, Duration::from_secs(240)).await;
    stop(workers);
    let report = ledger.check().await.unwrap();
    eprintln!(
        "{backend}: 4 worker processes ran {N} tasks over {KEYS} keys in {:.1} s; \
         most running at once per key: {}",
        took.as_secs_f64(),
        report.key_peak()
    );
    assert_at_least_once(&report, N, &ledger_path);
    assert_eq!(report.key_peaks.len(), KEYS, "every key ran");
    assert_eq!(report.key_peak(), 1, "two tasks of one key overlapped");
    assert_eq!(report.live_key_overlaps, 0, "a start found its key running");
    let pids: std::collections::HashSet<u32> = ledger
        .executions()
        .await
        .unwrap()
        .iter()
        .map(|e| e.pid)
        .collect();
    assert!(pids.len() >= 2, "the processes shared the keys: {pids:?}");
}

/// The most executions of `executions` that ran at once.
fn peak_overlap(executions: &[tenax_ledger::Execution]) -> usize {
    let mut edges: Vec<(i64, i32)> = Vec::new();
    for e in executions {
        edges.push((e.start_us, 1));
        edges.push((e.end_us.unwrap_or(i64::MAX), -1));
    }
    // An end and a start at the same microsecond do not overlap: ends first.
    edges.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        peak = peak.max(now);
    }
    usize::try_from(peak).unwrap_or(0)
}

/// Four `tenax worker` processes at their defaults (ten slots each, and the buffer of
/// claimed tasks beyond them) drain one queue limited to three running tasks: the
/// limit counts buffered tasks as running, so no more than three handlers ever run at
/// once across the processes, although forty slots are free.
async fn four_buffering_workers_hold_a_queue_limit(backend: &str) {
    let Some(url) = fresh_database(backend).await else {
        return;
    };
    const N: usize = 120;
    const LIMIT: u32 = 3;
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    client
        .set_queue_limit("limited", Some(LIMIT))
        .await
        .unwrap();
    for i in 0..N {
        client
            .enqueue_raw(
                "BANK_OPEN_ACCOUNT",
                &serde_json::json!({"customer": format!("c{i}"), "id_card": "12345678901234567"}),
            )
            .task_no(format!("Q-{i:05}"))
            .queue("limited")
            .await
            .unwrap();
    }
    let workers: Vec<Spawned> = (0..4)
        .map(|_| spawn_worker_with(&url, &ledger_path, "BANK_OPEN_ACCOUNT", "20ms", "limited"))
        .collect();
    let took = wait_succeeded(&client, N as u64, Duration::from_secs(240)).await;
    stop(workers);
    let report = ledger.check().await.unwrap();
    assert_at_least_once(&report, N, &ledger_path);
    let executions = ledger.executions().await.unwrap();
    let peak = peak_overlap(&executions);
    eprintln!(
        "{backend}: 4 worker processes ran {N} tasks of a queue limited to {LIMIT} in \
         {:.1} s; most running at once: {peak}",
        took.as_secs_f64()
    );
    assert!(peak <= LIMIT as usize, "{peak} handlers ran at once");
    assert!(peak >= 2, "the processes never ran two at once: {peak}");
    let pids: std::collections::HashSet<u32> = executions.iter().map(|e| e.pid).collect();
    assert!(pids.len() >= 2, "one process ran every task: {pids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_queue_limit_holds_across_buffering_processes() {
    four_buffering_workers_hold_a_queue_limit("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_queue_limit_holds_across_buffering_processes() {
    four_buffering_workers_hold_a_queue_limit("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keys_never_overlap_across_processes() {
    four_workers_never_run_two_tasks_of_one_key_at_once("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_keys_never_overlap_across_processes() {
    four_workers_never_run_two_tasks_of_one_key_at_once("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_four_workers_process_ten_thousand_tasks() {
    four_workers_process_ten_thousand_tasks("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_mixed_fleet() {
    a_mixed_fleet_runs_each_type_only_where_it_is_known("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_four_workers_process_ten_thousand_tasks() {
    four_workers_process_ten_thousand_tasks("mysql").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_mixed_fleet() {
    a_mixed_fleet_runs_each_type_only_where_it_is_known("mysql").await;
}
