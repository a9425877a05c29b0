//! Database outage: real `tenax worker` processes on a private PostgreSQL instance
//! (its own port and data directory, never the shared service) that is killed in
//! immediate mode mid-run and started again. No Tenax process may exit, the workers
//! must resume within seconds of the database's return, no task may be lost, and the
//! execution ledger must show no overlapping executions.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use tenax::storage::TaskListParams;
use tenax::{Client, TaskStatus};
use tenax_ledger::{Execution, Ledger};
use tenax_torture::private_pg::{find_bindir, PrivatePostgres};

/// Tasks enqueued; at about 10 ms each on 2 × 10 slots the run lasts a few seconds, so
/// the outage lands in its middle.
const TASKS: usize = 1500;
/// How long the database stays down.
const OUTAGE: Duration = Duration::from_secs(2);
/// The first task must finish this soon after the database is back.
const RESUME_WITHIN: Duration = Duration::from_secs(10);
/// Every task must have succeeded this soon after the database is back.
const ALL_DONE_WITHIN: Duration = Duration::from_secs(60);

/// Worker processes, killed (SIGKILL) when dropped, even by a failing assertion.
struct Workers {
    children: Vec<Child>,
    logs: Vec<PathBuf>,
}

impl Workers {
    fn spawn(count: usize, db: &str, ledger: &Path, dir: &Path, lease: &str) -> Self {
        let mut workers = Self {
            children: Vec::new(),
            logs: Vec::new(),
        };
        for i in 0..count {
            let log = dir.join(format!("worker-{i}.log"));
            let child = Command::new(env!("CARGO_BIN_EXE_tenax"))
                .args(["--database-url", db, "worker"])
                .args(["--command", "BANK_OPEN_ACCOUNT", "--concurrency", "10"])
                .args(["--lease-ttl", lease, "--poll-interval", "50ms"])
                .args(["--bank-failure-rate", "0", "--bank-latency", "10ms"])
                .arg("--ledger")
                .arg(ledger)
                // The reaper's passes too, so a failure can tell who took a lease.
                .env("TENAX_LOG", "warn,tenax_runtime::maintenance=info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&log).unwrap())
                .spawn()
                .expect("start tenax worker");
            workers.children.push(child);
            workers.logs.push(log);
        }
        workers
    }

    /// Panic (with the workers' logs) if any worker process has exited.
    fn assert_all_running(&mut self, when: &str) {
        let mut exited = Vec::new();
        for (i, child) in self.children.iter_mut().enumerate() {
            if let Some(status) = child.try_wait().unwrap() {
                exited.push(format!("worker {i} (pid {}) exited: {status}", child.id()));
            }
        }
        assert!(
            exited.is_empty(),
            "{when}: {}\n{}",
            exited.join("; "),
            self.log_tails()
        );
    }

    /// Lines of the workers' logs that contain `needle`.
    fn log_lines_with(&self, needle: &str) -> usize {
        self.logs
            .iter()
            .map(|log| {
                std::fs::read_to_string(log)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains(needle))
                    .count()
            })
            .sum()
    }

    /// The lines of the workers' logs that contain any of `needles`, each after its
    /// worker's number.
    fn lines_with(&self, needles: &[&str]) -> String {
        let mut found = String::new();
        for (i, log) in self.logs.iter().enumerate() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            for line in text
                .lines()
                .filter(|l| needles.iter().any(|n| l.contains(n)))
            {
                found.push_str(&format!("worker {i}: {line}\n"));
            }
        }
        found
    }

    fn log_tails(&self) -> String {
        self.logs
            .iter()
            .enumerate()
            .map(|(i, log)| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                format!("--- worker {i} log (last 20 lines) ---\n{tail}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// SIGKILL every worker and tell the ledger, so executions they had open end there.
    async fn kill_all(&mut self, ledger: &Ledger) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            ledger.record_kill(child.id()).await.unwrap();
        }
        self.children.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Poll `check` every 50 ms until it yields a value; panic with `what` after `within`.
/// Storage errors inside `check` (the database may be down) count as "not yet".
async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn succeeded(client: &Client) -> Option<u64> {
    client
        .stats()
        .await
        .ok()
        .map(|s| s.count(TaskStatus::Succeeded))
}

/// Every task, read directly (newest first).
async fn all_tasks(client: &Client) -> Option<Vec<tenax::TaskRecord>> {
    client
        .list(&TaskListParams {
            limit: TASKS as u32 + 100,
            ..Default::default()
        })
        .await
        .ok()
}

fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

async fn enqueue_all(client: &Client) -> BTreeSet<String> {
    let numbers: Vec<String> = (0..TASKS).map(|i| format!("OUTAGE-{i:04}")).collect();
    let mut inserts = tokio::task::JoinSet::new();
    for chunk in numbers.chunks(TASKS.div_ceil(8)) {
        let client = client.clone();
        let chunk = chunk.to_vec();
        inserts.spawn(async move {
            for no in chunk {
                let payload = serde_json::json!({
                    "customer": format!("customer-{no}"),
                    "id_card": "123456789012345677",
                });
                client
                    .enqueue_raw("BANK_OPEN_ACCOUNT", &payload)
                    .task_no(no)
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(joined) = inserts.join_next().await {
        joined.unwrap();
    }
    numbers.into_iter().collect()
}

/// A private PostgreSQL server, or `None` after a `SKIP` line when the server binaries
/// are missing (a failure under `TENAX_REQUIRE_ALL_BACKENDS=1`).
fn private_postgres() -> Option<PrivatePostgres> {
    if find_bindir().is_none() {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "no PostgreSQL server binaries, but TENAX_REQUIRE_ALL_BACKENDS=1: every backend must be tested"
        );
        eprintln!("SKIP: no PostgreSQL server binaries (initdb, pg_ctl) found");
        return None;
    }
    Some(PrivatePostgres::start().expect("start a private PostgreSQL"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_ride_out_an_immediate_restart_of_their_database() {
    // Longer than the lease: every lease held at the crash expires and every running
    // handler must fence itself.
    ride_out("2s").await;
}

/// Each task whose handler succeeded and yet ran again: with a database stop shorter
/// than the lease, none. (A handler stopped by its fence may run again: its task was
/// not finished.)
fn finished_then_run_again(executions: &[Execution]) -> Vec<String> {
    let mut by_task: BTreeMap<&str, Vec<&Execution>> = BTreeMap::new();
    for e in executions {
        by_task.entry(e.task_no.as_str()).or_default().push(e);
    }
    by_task
        .into_iter()
        .filter(|(_, runs)| {
            let last = runs.iter().map(|e| e.start_us).max().unwrap_or(0);
            runs.iter()
                .any(|e| e.outcome.as_deref() == Some("succeeded") && e.start_us < last)
        })
        .map(|(no, _)| no.to_owned())
        .collect()
}

/// The database stops for 2 s under workers with 3 s leases. The heartbeat retries at
/// once after a failure on a connection of its own, so it renews the leases within
/// about 200 ms of the database's return, and no reaper takes a lease in the TTL after
/// it: a task whose handler had finished has its outcome written, and never runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_stop_shorter_than_the_lease_re_runs_no_finished_task() {
    let Some((executions, notable)) = ride_out("3s").await else {
        return;
    };
    let again = finished_then_run_again(&executions);
    assert!(
        again.is_empty(),
        "{} tasks ran again after their handler had succeeded: {again:?}\n\
         what the workers logged of leases and outcomes:\n{notable}",
        again.len()
    );
}

/// Workers with leases of `lease` ride out an immediate restart of their database
/// ([`OUTAGE`] down): none exits, they resume within [`RESUME_WITHIN`], no task is lost
/// and no two executions of a task overlap. The ledger's executions and the workers'
/// log lines about leases and outcomes, or `None` when skipped.
async fn ride_out(lease: &str) -> Option<(Vec<Execution>, String)> {
    let test_started = Instant::now();
    let mut pg = tokio::task::block_in_place(private_postgres)?;
    let db = pg.url();
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&db).await.unwrap();
    let enqueued = enqueue_all(&client).await;
    assert_eq!(enqueued.len(), TASKS);

    let run_started = Instant::now();
    let mut workers = Workers::spawn(2, &db, &ledger_path, dir.path(), lease);

    // About a third done: crash the database.
    let before = wait_for(
        "a third of the tasks to succeed",
        Duration::from_secs(30),
        || async { succeeded(&client).await.filter(|&n| n >= TASKS as u64 / 3) },
    )
    .await;
    assert!(
        (before as usize) < TASKS,
        "the run ended before the restart: it must land mid-run"
    );
    workers.assert_all_running("before the restart");
    let restart = tokio::task::block_in_place(|| pg.restart_immediate(OUTAGE)).unwrap();
    workers.assert_all_running("right after the restart");

    // Resume: the first task to finish after the database is back.
    let back_up: DateTime<Utc> = restart.up_wall.into();
    let resumed_at = wait_for(
        "a task to finish after the database is back",
        RESUME_WITHIN + Duration::from_secs(5),
        || async {
            all_tasks(&client)
                .await?
                .iter()
                .filter(|t| t.status == TaskStatus::Succeeded)
                .filter_map(|t| t.finished_at)
                .filter(|&at| at >= back_up)
                .min()
        },
    )
    .await;
    let resume = (resumed_at - back_up).to_std().unwrap_or_default();
    // And the first execution started after it (from the ledger: a fresh claim, not an
    // outcome write held over from before the crash).
    let up_us = micros(restart.up_wall);
    let first_start_us = wait_for(
        "an execution to start after the database is back",
        RESUME_WITHIN + Duration::from_secs(5),
        || async {
            ledger
                .executions()
                .await
                .ok()?
                .iter()
                .map(|e| e.start_us)
                .filter(|&us| us >= up_us)
                .min()
        },
    )
    .await;
    let first_start_after = Duration::from_micros((first_start_us - up_us) as u64);
    assert!(
        resume <= RESUME_WITHIN && first_start_after <= RESUME_WITHIN,
        "the workers took {resume:?} to finish a task and {first_start_after:?} to start one \
         after the database came back\n{}",
        workers.log_tails()
    );

    // No task lost: every enqueued number ends `succeeded`.
    let tasks = wait_for(
        "every task to succeed",
        ALL_DONE_WITHIN.saturating_sub(restart.up_at.elapsed()),
        || async {
            let tasks = all_tasks(&client).await?;
            tasks
                .iter()
                .all(|t| t.status == TaskStatus::Succeeded)
                .then_some(tasks)
                .filter(|t| t.len() >= TASKS)
        },
    )
    .await;
    let all_done = restart.up_at.elapsed();
    workers.assert_all_running("at the end");
    let outage_warnings = workers.log_lines_with("WARN");
    let notable = workers.lines_with(&["lease", "outcome", "reaped", "fenced", "clock"]);
    workers.kill_all(&ledger).await;

    let succeeded_nos: BTreeSet<String> = tasks.iter().map(|t| t.task_no.to_string()).collect();
    assert_eq!(
        succeeded_nos, enqueued,
        "exactly the enqueued tasks, all succeeded"
    );
    let retried = tasks.iter().filter(|t| t.attempt > 1).count();

    let report = ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.tasks, TASKS, "every task ran");
    assert!(report.open.is_empty(), "{report:#?}");

    println!(
        "outage, leases of {lease}: {:?} down, {before}/{TASKS} succeeded before it; first finish {resume:?} after \
         the database was back, first new execution {first_start_after:?} after; all done \
         {all_done:?} after; {retried} tasks took more than one attempt, {} executions for \
         {TASKS} tasks; {outage_warnings} warnings logged; run {:?}, test {:?}",
        restart.outage(),
        report.executions,
        run_started.elapsed(),
        test_started.elapsed(),
    );
    drop(pg);
    Some((ledger.executions().await.unwrap(), notable))
}
