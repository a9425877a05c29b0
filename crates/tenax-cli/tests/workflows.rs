//! Workflows under real `tenax worker` processes, checked against the execution
//! ledger: no child starts before all its parents succeeded (fan-out and fan-in with
//! 1,000 children), a child reads its parents' outputs, and a saga compensates the
//! steps before a dead step in reverse order, each compensation finished exactly once,
//! also when a worker is killed with SIGKILL during a compensation. SQLite always;
//! PostgreSQL and MariaDB when their `TENAX_TEST_*_URL` is set.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tenax::storage::{TaskRef, WorkflowState};
use tenax::{Client, TaskStatus, Workflow};
use tenax_ledger::{Execution, Ledger};

mod support;
use support::{fresh, SpawnGuarded, Spawned};

fn spawn_worker(url: &str, ledger: &Path) -> Spawned {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url, "worker", "--command", "FLOW_STEP"])
        .args([
            "--concurrency",
            "10",
            "--poll-interval",
            "50ms",
            "--lease-ttl",
            "2s",
        ])
        .arg("--ledger")
        .arg(ledger)
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn_guarded("tenax worker")
}

fn stop(worker: &mut Spawned) {
    worker.kill().unwrap();
    worker.wait().unwrap();
}

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
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn succeeded<'a>(executions: &'a [Execution], task_no: &str) -> Vec<&'a Execution> {
    executions
        .iter()
        .filter(|e| e.task_no == task_no && e.outcome.as_deref() == Some("succeeded"))
        .collect()
}

async fn dag_order_holds_under_real_workers(backend: &str) {
    let Some((dir, url)) = fresh(backend, "tenax_wf").await else {
        return;
    };
    let client = Client::connect(&url).await.unwrap();
    let step = |value: i64| client.enqueue_raw("FLOW_STEP", &json!({ "value": value }));
    // root → 1,000 children → sink, and a chain and a diamond beside it.
    let mut flow = Workflow::new("fan").task("root", step(1).task_no("fan-root"));
    for i in 0..1000 {
        flow = flow
            .task(format!("c{i}"), step(1).task_no(format!("fan-c{i}")))
            .after(["root"]);
    }
    flow = flow
        .task("sink", step(0).task_no("fan-sink"))
        .after((0..1000).map(|i| format!("c{i}")))
        .task("a", step(10).task_no("fan-a"))
        .task("b", step(20).task_no("fan-b"))
        .after(["a"])
        .task("c", step(30).task_no("fan-c"))
        .after(["a"])
        .task("d", step(0).task_no("fan-d"))
        .after(["b", "c"]);
    let detail = client.enqueue_workflow(flow).await.unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let mut workers = vec![
        spawn_worker(&url, &ledger_path),
        spawn_worker(&url, &ledger_path),
    ];
    let id = detail.workflow.id;
    wait_for(
        "the workflow succeeds",
        Duration::from_secs(120),
        || async {
            let w = client.workflow(id).await.unwrap().unwrap();
            assert_ne!(w.workflow.state, WorkflowState::Failed, "{:?}", w.workflow);
            (w.workflow.state == WorkflowState::Succeeded).then_some(())
        },
    )
    .await;
    for worker in &mut workers {
        stop(worker);
    }
    let detail = client.workflow(id).await.unwrap().unwrap();
    let executions = ledger.executions().await.unwrap();
    for task in &detail.tasks {
        let runs = succeeded(&executions, task.task.task_no.as_str());
        assert_eq!(runs.len(), 1, "{} ran {} times", task.key, runs.len());
        for parent in &task.parents {
            let parent_no = format!("fan-{parent}");
            let parent_run = succeeded(&executions, &parent_no)[0];
            assert!(
                runs[0].start_us >= parent_run.end_us.unwrap(),
                "{} started before its parent {parent} ended",
                task.key
            );
        }
    }
    // Outputs read from the parents: each child is 1 + root's 1; the sink sums them.
    let output = |no: &str| {
        let client = client.clone();
        let no = no.to_owned();
        async move {
            let task = client
                .get(&TaskRef::No(tenax::TaskNo::new(no).unwrap()))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(task.status, TaskStatus::Succeeded);
            serde_json::from_str::<i64>(task.result.as_deref().unwrap()).unwrap()
        }
    };
    assert_eq!(output("fan-c7").await, 2);
    assert_eq!(output("fan-sink").await, 2000);
    assert_eq!(output("fan-d").await, 30 + 40);
    assert!(ledger.check().await.unwrap().is_clean());
}

/// The step a compensation's number names (`saga-s2:compensate:...` → `s2`).
fn compensated(e: &Execution) -> Option<String> {
    let (no, _) = e.task_no.split_once(":compensate:")?;
    Some(no.trim_start_matches("saga-").to_owned())
}

async fn a_saga_compensates_in_reverse_order_across_a_killed_worker(backend: &str) {
    let Some((dir, url)) = fresh(backend, "tenax_wf").await else {
        return;
    };
    let client = Client::connect(&url).await.unwrap();
    let step = |fail: bool, compensate_ms: u64| {
        client.enqueue_raw(
            "FLOW_STEP",
            &json!({ "fail": fail, "compensate_ms": compensate_ms, "value": 1 }),
        )
    };
    let saga = Workflow::saga("order")
        .step("s1", step(false, 10).task_no("saga-s1"))
        .step("s2", step(false, 3000).task_no("saga-s2"))
        .step("s3", step(true, 10).task_no("saga-s3"))
        .step("s4", step(false, 10).task_no("saga-s4"));
    let id = client.enqueue_workflow(saga).await.unwrap().workflow.id;
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let mut first = spawn_worker(&url, &ledger_path);
    // Step 2's compensation takes 3 s: the first worker is killed inside it.
    wait_for(
        "step 2's compensation starts",
        Duration::from_secs(60),
        || async {
            let e = ledger.executions().await.unwrap();
            e.iter()
                .any(|e| compensated(e).as_deref() == Some("s2"))
                .then_some(())
        },
    )
    .await;
    let pid = first.id();
    stop(&mut first); // SIGKILL
    ledger.record_kill(pid).await.unwrap();
    let mut second = spawn_worker(&url, &ledger_path);
    let done = wait_for(
        "the saga is compensated",
        Duration::from_secs(60),
        || async {
            let w = client.workflow(id).await.unwrap().unwrap();
            (w.workflow.state == WorkflowState::Compensated).then_some(w)
        },
    )
    .await;
    stop(&mut second);
    let statuses: HashMap<String, TaskStatus> = done
        .tasks
        .iter()
        .map(|t| (t.key.clone(), t.task.status))
        .collect();
    assert_eq!(statuses["s3"], TaskStatus::Dead);
    assert_eq!(statuses["s4"], TaskStatus::Cancelled);
    let executions = ledger.executions().await.unwrap();
    // Each compensation finished exactly once, in reverse order, one after another.
    let finished: Vec<(String, &Execution)> = executions
        .iter()
        .filter(|e| e.outcome.as_deref() == Some("succeeded"))
        .filter_map(|e| compensated(e).map(|s| (s, e)))
        .collect();
    let order: Vec<&str> = finished.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(order, ["s3", "s2", "s1"], "{executions:#?}");
    for pair in finished.windows(2) {
        assert!(
            pair[1].1.start_us >= pair[0].1.end_us.unwrap(),
            "{executions:#?}"
        );
    }
    // The killed attempt of step 2's compensation is the only other one.
    let killed: Vec<_> = executions
        .iter()
        .filter(|e| e.outcome.as_deref() == Some("killed"))
        .collect();
    assert_eq!(killed.len(), 1, "{executions:#?}");
    assert_eq!(compensated(killed[0]).as_deref(), Some("s2"));
    assert!(succeeded(&executions, "saga-s4").is_empty());
    assert!(ledger.check().await.unwrap().is_clean());
}

macro_rules! per_backend {
    ($($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn dag_order_holds_under_real_workers() {
                    super::dag_order_holds_under_real_workers(stringify!($backend)).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_saga_compensates_in_reverse_order_across_a_killed_worker() {
                    super::a_saga_compensates_in_reverse_order_across_a_killed_worker(
                        stringify!($backend),
                    )
                    .await;
                }
            }
        )*
    };
}

per_backend!(sqlite, postgres, mysql);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_are_listed_and_shown_from_the_cli() {
    let (dir, url) = fresh("sqlite", "tenax_wf").await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    let step = |value: i64| client.enqueue_raw("FLOW_STEP", &json!({ "value": value }));
    let flow = Workflow::new("nightly-report")
        .task("extract", step(1).task_no("cli-extract"))
        .task("load", step(2).task_no("cli-load"))
        .after(["extract"]);
    let id = client.enqueue_workflow(flow).await.unwrap().workflow.id;
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tenax"))
            .args(["--database-url", &url])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let list = run(&["workflows", "list"]);
    assert!(list.contains("nightly-report"), "{list}");
    assert!(list.contains("running"), "{list}");
    assert!(list.contains("1 pending, 1 blocked"), "{list}");
    assert!(list.contains("1 workflow(s)"), "{list}");
    let show = run(&["workflows", "show", &id.to_string()]);
    assert!(
        show.contains("cli-extract") && show.contains("cli-load"),
        "{show}"
    );
    let load_line = show.lines().find(|l| l.contains("cli-load")).unwrap();
    assert!(
        load_line.contains("blocked") && load_line.contains("extract"),
        "{load_line}"
    );
    // Run it, then it shows as succeeded.
    let ledger = dir.path().join("ledger.db");
    let mut worker = spawn_worker(&url, &ledger);
    wait_for("the workflow succeeds", Duration::from_secs(30), || async {
        let w = client.workflow(id).await.unwrap().unwrap();
        (w.workflow.state == WorkflowState::Succeeded).then_some(())
    })
    .await;
    stop(&mut worker);
    let show = run(&["workflows", "show", &id.to_string()]);
    assert!(show.contains("succeeded"), "{show}");
    let missing = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", &url, "workflows", "show", "999"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("not found"));
}
