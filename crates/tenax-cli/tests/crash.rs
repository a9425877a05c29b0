//! Crash tests: real `tenax worker` processes killed with SIGKILL mid-task, checked
//! against the execution ledger.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tenax::storage::TaskRef;
use tenax::{AttemptOutcome, Client, CompensationState, TaskKind, TaskNo, TaskStatus};
use tenax_ledger::Ledger;

mod support;
use support::{SpawnGuarded, Spawned};

fn tenax() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
}

/// A worker process with a 1 s lease, recording every execution in the ledger.
fn spawn_worker(db: &str, ledger: &Path, latency: &str) -> Spawned {
    spawn_worker_in(tenax(), db, ledger, latency, "1s")
}

/// A worker process run by `tenax` (with whatever global flags it holds), with lease
/// `lease_ttl`, recording every execution in the ledger.
fn spawn_worker_in(
    mut tenax: Command,
    db: &str,
    ledger: &Path,
    latency: &str,
    lease_ttl: &str,
) -> Spawned {
    tenax
        .args([
            "--database-url",
            db,
            "worker",
            "--lease-ttl",
            lease_ttl,
            "--poll-interval",
            "50ms",
        ])
        .args(["--bank-failure-rate", "0", "--bank-latency", latency])
        .arg("--ledger")
        .arg(ledger)
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn_guarded("tenax worker")
}

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    db: String,
    ledger_path: std::path::PathBuf,
    ledger: Ledger,
    client: Client,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&db).await.unwrap();
    Setup {
        _dir: dir,
        db,
        ledger_path,
        ledger,
        client,
    }
}

fn enqueue(db: &str, task_no: &str, id_card: &str) {
    let payload = format!(r#"{{"customer":"ada","id_card":"{id_card}"}}"#);
    let status = tenax()
        .args([
            "--database-url",
            db,
            "enqueue",
            "BANK_OPEN_ACCOUNT",
            &payload,
            "--no",
            task_no,
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
}

async fn kill(child: &mut Child, ledger: &Ledger) {
    let pid = child.id();
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    ledger.record_kill(pid).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_task_loses_nothing_and_runs_nothing_twice_at_once() {
    let s = setup().await;
    enqueue(&s.db, "ACC-1", "12345678901234567");
    // The first worker's bank call takes 10 s: it is killed inside it.
    let mut first = spawn_worker(&s.db, &s.ledger_path, "10s");
    wait_for("the first worker starts the task", || async {
        let e = s.ledger.executions().await.unwrap();
        (!e.is_empty()).then_some(())
    })
    .await;
    kill(&mut first, &s.ledger).await;
    let mut second = spawn_worker(&s.db, &s.ledger_path, "20ms");
    let no = TaskRef::No(TaskNo::new("ACC-1").unwrap());
    let done = wait_for("a new worker finishes the task", || async {
        s.client
            .get(&no)
            .await
            .unwrap()
            .filter(|t| t.status == TaskStatus::Succeeded)
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(done.attempt, 2);
    let history = s.client.attempts(done.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded]
    );
    let report = s.ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.executions, 2);
    assert!(report.open.is_empty(), "{report:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compensation_finishes_exactly_once_when_its_worker_is_killed() {
    let s = setup().await;
    // An invalid id card: dead at once, then compensated. Every bank call takes 10 s,
    // so the first worker is killed inside the compensation.
    enqueue(&s.db, "ACC-2", "1234567890123456X");
    let mut first = spawn_worker(&s.db, &s.ledger_path, "10s");
    wait_for("the compensation starts", || async {
        let e = s.ledger.executions().await.unwrap();
        e.iter().any(|e| e.kind == "compensate").then_some(())
    })
    .await;
    kill(&mut first, &s.ledger).await;
    let mut second = spawn_worker(&s.db, &s.ledger_path, "20ms");
    let no = TaskRef::No(TaskNo::new("ACC-2").unwrap());
    let parent = wait_for("the compensation is recorded", || async {
        s.client
            .get(&no)
            .await
            .unwrap()
            .filter(|t| t.compensation == Some(CompensationState::Succeeded))
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(parent.status, TaskStatus::Dead);
    assert!(parent.last_error.unwrap().contains("invalid id card"));
    let all = s
        .client
        .list(&tenax::storage::TaskListParams {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    let compensations: Vec<_> = all
        .iter()
        .filter(|t| t.kind == TaskKind::Compensate)
        .collect();
    assert_eq!(compensations.len(), 1, "one compensation task per death");
    let history = s.client.attempts(compensations[0].id).await.unwrap();
    let finished: Vec<_> = history
        .iter()
        .filter(|a| a.outcome == AttemptOutcome::Succeeded)
        .collect();
    assert_eq!(
        finished.len(),
        1,
        "recorded as finished exactly once: {history:#?}"
    );
    assert_eq!(history[0].outcome, AttemptOutcome::LeaseExpired);
    let report = s.ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
}

/// A worker killed after its handler returned but before the transaction holding the
/// success (a completion batch, by default) committed: nothing of the success was
/// written, the task runs again under a new lease, and it succeeds exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_before_the_completion_batch_commits_repeats_the_execution_and_loses_nothing() {
    use tenax::sqlx::Connection;

    let s = setup().await;
    enqueue(&s.db, "ACC-3", "12345678901234567");
    let mut first = spawn_worker(&s.db, &s.ledger_path, "500ms");
    wait_for("the first worker starts the task", || async {
        let e = s.ledger.executions().await.unwrap();
        (!e.is_empty()).then_some(())
    })
    .await;
    // Hold SQLite's write lock from another connection: the handler still finishes,
    // but its completion cannot commit.
    let mut lock = tenax::sqlx::SqliteConnection::connect(&s.db).await.unwrap();
    tenax::sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    wait_for("the first handler returns", || async {
        let e = s.ledger.executions().await.unwrap();
        e.iter()
            .any(|e| e.outcome.as_deref() == Some("succeeded"))
            .then_some(())
    })
    .await;
    kill(&mut first, &s.ledger).await;
    tenax::sqlx::query("COMMIT")
        .execute(&mut lock)
        .await
        .unwrap();
    let no = TaskRef::No(TaskNo::new("ACC-3").unwrap());
    let running = s.client.get(&no).await.unwrap().unwrap();
    assert_eq!(
        (running.status, running.attempt),
        (TaskStatus::Running, 1),
        "the success was not written"
    );
    let mut second = spawn_worker(&s.db, &s.ledger_path, "20ms");
    let done = wait_for("a new worker finishes the task", || async {
        s.client
            .get(&no)
            .await
            .unwrap()
            .filter(|t| t.status == TaskStatus::Succeeded)
    })
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(done.attempt, 2);
    let history = s.client.attempts(done.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded]
    );
    let report = s.ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.executions, 2, "the execution ran again");
}

/// A worker with one place for an uncommitted outcome, two slots and a buffer of two,
/// killed while its completions cannot commit: one handler's outcome waits uncommitted,
/// two finished handlers hold their slots for want of a place, and a claimed task
/// waits in the buffer. Nothing is lost: every task succeeds once in the database. The
/// kill repeats only executions whose outcomes had not committed, at most
/// `concurrency + complete_batch` of them, and never two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_with_a_buffer_and_uncommitted_outcomes_loses_nothing_and_repeats_within_the_bound()
{
    use tenax::sqlx::Connection;

    const TASKS: usize = 8;
    const CONCURRENCY: usize = 2;
    const COMPLETE_BATCH: usize = 1;
    let s = setup().await;
    let config = s._dir.path().join("tenax.toml");
    std::fs::write(
        &config,
        format!("[worker]\nconcurrency = {CONCURRENCY}\nprefetch = 2\ncomplete_batch = {COMPLETE_BATCH}\n"),
    )
    .unwrap();
    for i in 0..TASKS {
        enqueue(&s.db, &format!("ACC-B{i}"), "12345678901234567");
    }
    let mut with_config = tenax();
    with_config.arg("--config").arg(&config);
    // Bank calls of 0.5 to 1.5 s leave the lock below time to be taken before any
    // handler returns; an 8 s lease keeps every handler short of its fence meanwhile.
    let mut first = spawn_worker_in(with_config, &s.db, &s.ledger_path, "1s", "8s");
    let running = || async {
        s.client
            .list(&tenax::storage::TaskListParams {
                status: Some(TaskStatus::Running),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .len()
    };
    wait_for("two tasks run and two are buffered", || async {
        (running().await == 4).then_some(())
    })
    .await;
    // From now on nothing the first worker writes can commit.
    let mut lock = tenax::sqlx::SqliteConnection::connect(&s.db).await.unwrap();
    tenax::sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut lock)
        .await
        .unwrap();
    // A handler may have returned, and its outcome committed, between the count above
    // and the lock (a slow machine): the executions that count are those after it.
    let count = |status: &'static str| {
        tenax::sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM tenax_tasks WHERE status = ?")
            .bind(status)
    };
    let committed = count("succeeded").fetch_one(&mut lock).await.unwrap();
    let held_at_lock = count("running").fetch_one(&mut lock).await.unwrap();
    // Two handlers return: one outcome takes the only place and frees its slot, so a
    // buffered task starts and returns too; the other two hold their slots.
    wait_for("three handlers return after the lock", || async {
        let e = s.ledger.executions().await.unwrap();
        let returned = e
            .iter()
            .filter(|e| e.outcome.as_deref() == Some("succeeded"))
            .count();
        (returned == committed as usize + 3).then_some(())
    })
    .await;
    kill(&mut first, &s.ledger).await;
    tenax::sqlx::query("COMMIT")
        .execute(&mut lock)
        .await
        .unwrap();
    assert_eq!(
        running().await,
        held_at_lock as usize,
        "nothing the first worker did after the lock was written"
    );
    let mut second = spawn_worker(&s.db, &s.ledger_path, "20ms");
    for i in 0..TASKS {
        let no = TaskRef::No(TaskNo::new(format!("ACC-B{i}")).unwrap());
        wait_for("a new worker finishes every task", || async {
            s.client
                .get(&no)
                .await
                .unwrap()
                .filter(|t| t.status == TaskStatus::Succeeded)
        })
        .await;
    }
    second.kill().unwrap();
    second.wait().unwrap();
    let report = s.ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
    let repeats = report.executions - TASKS;
    assert_eq!(
        repeats, 3,
        "each returned handler ran again, the buffered task once"
    );
    assert!(repeats <= CONCURRENCY + COMPLETE_BATCH);
}

/// The recovery bound the guide states (concepts, "The reaper"): after a worker is
/// killed with SIGKILL, every task it held, running or buffered, starts again within
/// `lease_ttl` plus one reaper interval (+ 20 %) of the kill. The worker that takes
/// them over starts just after the kill (its reaper waits one TTL first, within the
/// same bound); 2 s of slack cover its process start, a claim and the start.
async fn a_killed_workers_tasks_start_again_within_the_recovery_bound(backend: &str) {
    const HELD: usize = 10;
    let Some((dir, url)) = support::fresh(backend, "tenax_crash").await else {
        return;
    };
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    for n in 0..HELD {
        enqueue(&url, &format!("HELD-{n}"), "12345678901234567");
    }
    // Its first claim takes all ten: five run (their bank calls take a minute), five
    // wait in its prefetch buffer.
    let mut victim = tenax();
    victim.env("TENAX_WORKER_CONCURRENCY", "5");
    let mut victim = spawn_worker_in(victim, &url, &ledger_path, "60s", "2s");
    let client = Client::connect(&url).await.unwrap();
    wait_for("the victim runs five and holds the rest", || async {
        let running = ledger.executions().await.unwrap().len();
        let stats = client.stats().await.unwrap();
        let leased = stats
            .by_status
            .iter()
            .find(|(status, _)| *status == TaskStatus::Running)
            .map_or(0, |(_, n)| *n);
        (running == 5 && leased == HELD as u64).then_some(())
    })
    .await;
    kill(&mut victim, &ledger).await;
    let killed_us = chrono::Utc::now().timestamp_micros();
    let mut survivor = spawn_worker_in(tenax(), &url, &ledger_path, "20ms", "2s");
    let restarts = wait_for("every held task starts again", || async {
        let executions = ledger.executions().await.unwrap();
        let again: Vec<_> = executions
            .into_iter()
            .filter(|e| e.pid == survivor.id())
            .collect();
        (again.len() == HELD).then_some(again)
    })
    .await;
    survivor.kill().unwrap();
    survivor.wait().unwrap();
    let ttl = Duration::from_secs(2);
    let bound = ttl + (ttl / 6).mul_f64(1.2) + Duration::from_secs(2);
    let slowest = restarts
        .iter()
        .map(|e| e.start_us)
        .max()
        .unwrap_or(killed_us);
    eprintln!(
        "{backend}: the last held task started again {:?} after the kill (bound {bound:?})",
        Duration::from_micros((slowest - killed_us).max(0) as u64)
    );
    for e in &restarts {
        let after = Duration::from_micros((e.start_us - killed_us).max(0) as u64);
        assert!(
            after <= bound,
            "{} started again {after:?} after the kill (bound {bound:?})",
            e.task_no
        );
    }
    let report = ledger.check().await.unwrap();
    assert!(report.is_clean(), "{report:#?}");
}

macro_rules! per_backend {
    ($($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_killed_workers_tasks_start_again_within_the_recovery_bound() {
                    super::a_killed_workers_tasks_start_again_within_the_recovery_bound(
                        stringify!($backend),
                    )
                    .await;
                }
            }
        )*
    };
}

per_backend!(sqlite, postgres, mysql);
