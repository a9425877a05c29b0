//! Soak: every table the pruner keeps bounded returns to its floor.
//!
//! Tasks in workflows (with dependencies), tasks with concurrency keys and audit entries
//! go through real workers whose pruner runs with a retention of two seconds; the test
//! waits (with a deadline) until every table is back to its floor: empty, as nothing
//! is left running. It prints the tables' peak and final sizes and the time taken.
//!
//! In CI: 100 000 tasks on SQLite, 10 000 on PostgreSQL and MariaDB/MySQL. The full
//! 100 000 on those two:
//!
//! ```text
//! TENAX_TEST_POSTGRES_URL=... TENAX_TEST_MYSQL_URL=... \
//!   cargo test --workspace --all-features --test it -- soak --ignored --nocapture --test-threads 1
//! ```
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tenax_core::{Command, CommandError, Registry, TaskContext};
use tenax_runtime::{Worker, WorkerConfig};
use tenax_storage::testing::bulk_insert::numbered;
use tenax_storage::testing::prune::table_rows;
use tenax_storage::testing::Harness;
use tenax_storage::{
    AuditAppendParams, TaskInsertManyParams, WorkflowInsertParams, WorkflowKind, WorkflowPolicy,
    WorkflowTaskParams,
};
use tokio_util::sync::CancellationToken;

/// Succeeds at once.
struct Noop;

impl Command for Noop {
    const TYPE: &'static str = "TEST_COMMAND";
    type Context = serde_json::Value;
    type Output = ();

    async fn execute(&self, _: serde_json::Value, _: &TaskContext) -> Result<(), CommandError> {
        Ok(())
    }
}

/// Tasks per workflow: a root, eight children of it, and a join of the eight.
const FLOW: usize = 10;
/// Distinct concurrency keys, each with a limit of 4.
const KEYS: usize = 500;
/// One audit entry per this many tasks.
const AUDIT_EVERY: usize = 20;

fn worker_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 64,
        claim_batch: 200,
        complete_batch: 200,
        pruner_interval: Duration::from_millis(250),
        retention: Duration::from_secs(2),
        audit_retention: Duration::from_secs(2),
        prune_batch: 1000,
        scheduler: false,
        ..WorkerConfig::fast(Duration::from_secs(10))
    }
}

/// Half the tasks in workflows, half on their own with concurrency keys, and the audit
/// entries, enqueued while the workers run.
async fn enqueue(h: &Harness, tasks: usize) {
    let flows = tasks / 2 / FLOW;
    for f in 0..flows {
        let mut flow = Vec::with_capacity(FLOW);
        for t in 0..FLOW {
            let key = match t {
                0 => "root".to_owned(),
                t if t == FLOW - 1 => "join".to_owned(),
                t => format!("child-{t}"),
            };
            let after = match t {
                0 => Vec::new(),
                t if t == FLOW - 1 => (1..FLOW - 1).map(|c| format!("child-{c}")).collect(),
                _ => vec!["root".to_owned()],
            };
            flow.push(WorkflowTaskParams {
                key,
                task: numbered(&format!("flow-{f}-{t}"), f * FLOW + t),
                after,
            });
        }
        h.storage
            .workflow_insert(&WorkflowInsertParams {
                name: format!("soak {f}"),
                kind: WorkflowKind::Dag,
                policy: WorkflowPolicy::CancelDependents,
                tasks: flow,
                now: None,
            })
            .await
            .expect("insert a workflow");
    }
    let keyed = tasks - flows * FLOW;
    for start in (0..keyed).step_by(1000) {
        let batch = (start..keyed.min(start + 1000))
            .map(|i| {
                let mut task = numbered(&format!("keyed-{i}"), i);
                task.concurrency_key = Some(format!("key-{}", i % KEYS));
                task.concurrency_limit = 4;
                task
            })
            .collect();
        h.storage
            .task_insert_many(&TaskInsertManyParams {
                tasks: batch,
                now: None,
            })
            .await
            .expect("insert keyed tasks");
    }
    for i in 0..tasks / AUDIT_EVERY {
        h.storage
            .audit_append(&AuditAppendParams {
                actor: "cli:soak".into(),
                action: "task.cancel".into(),
                target: format!("task-{i}"),
                details: serde_json::Value::Null,
                now: None,
            })
            .await
            .expect("append an audit entry");
    }
}

async fn soak(h: Option<Harness>, tasks: usize, deadline: Duration) {
    let Some(h) = h else { return };
    let started = Instant::now();
    let mut registry = Registry::new();
    registry.register(Noop).unwrap();
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    // Two workers, each with its own pool, as two nodes would be.
    for _ in 0..2 {
        let storage = h.reopen().await;
        let worker = Worker::new(storage, registry.clone(), worker_config()).unwrap();
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }
    let producer = {
        let h = Harness::new(h.reopen().await, h.url.clone());
        tokio::spawn(async move { enqueue(&h, tasks).await })
    };
    let mut peak: BTreeMap<&'static str, i64> = BTreeMap::new();
    let give_up = tokio::time::Instant::now() + deadline;
    let mut producing = Some(producer);
    let last = loop {
        let rows = table_rows(&h.url).await;
        for (table, n) in &rows {
            let top = peak.entry(table).or_insert(0);
            *top = (*top).max(*n);
        }
        if let Some(p) = producing.take() {
            if p.is_finished() {
                p.await.expect("the producer finishes");
            } else {
                producing = Some(p);
            }
        }
        if producing.is_none() && rows.values().all(|n| *n == 0) {
            break rows;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "tables not back to their floor after {deadline:?}: {rows:?} (peak {peak:?})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = started.elapsed();
    stop.cancel();
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .expect("the worker stops")
            .unwrap()
            .unwrap();
    }
    let scheme = h.url.split(':').next().unwrap_or("?");
    let flows = tasks / 2 / FLOW;
    println!(
        "soak {scheme}: {tasks} tasks ({flows} workflows, {} dependency rows, {} keyed \
         tasks on {KEYS} keys, {} audit entries) back to the floor in {took:.1?}",
        flows * 2 * (FLOW - 2),
        tasks - flows * FLOW,
        tasks / AUDIT_EVERY
    );
    for (table, top) in &peak {
        println!("  {table:<24} peak {top:>7}  after {:>3}", last[table]);
    }
    // The tasks all ran and went: the peak shows the side tables were filled.
    assert!(peak["tenax_task_deps"] > 0 && peak["tenax_workflows"] > 0);
    assert!(peak["tenax_audit"] > 0);
    if let Some(keys) = peak.get("tenax_concurrency_keys") {
        assert!(*keys > 0);
    }
}

const CI_DEADLINE: Duration = Duration::from_secs(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_sqlite_every_table_returns_to_its_floor() {
    soak(
        tenax_storage::testing::sqlite_file().await,
        100_000,
        CI_DEADLINE,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_postgres_every_table_returns_to_its_floor() {
    soak(
        tenax_storage::testing::postgres_from_env().await,
        10_000,
        CI_DEADLINE,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_mysql_every_table_returns_to_its_floor() {
    soak(
        tenax_storage::testing::mysql_from_env().await,
        10_000,
        CI_DEADLINE,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "100 000 tasks: minutes; run by hand"]
async fn soak_postgres_full_every_table_returns_to_its_floor() {
    soak(
        tenax_storage::testing::postgres_from_env().await,
        100_000,
        Duration::from_secs(900),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "100 000 tasks: minutes; run by hand"]
async fn soak_mysql_full_every_table_returns_to_its_floor() {
    soak(
        tenax_storage::testing::mysql_from_env().await,
        100_000,
        Duration::from_secs(900),
    )
    .await;
}
