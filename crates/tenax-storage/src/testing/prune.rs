//! Conformance cases for the pruner's side tables: once the tasks that used them are
//! pruned, dependency rows, workflows, concurrency keys and old audit entries go; what a
//! live task still needs stays. Also the row counter the soak test reads.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tenax_core::{CompensationState, TaskRecord, TaskStatus};

use super::workflows::workflow;
use super::Harness;
use crate::{
    AuditAppendParams, Lease, SidePruneParams, TaskCompleteParams, TaskPruneParams, TaskRef,
    WorkflowKind, WorkflowPolicy,
};

/// The tables the pruner keeps bounded. `tenax_concurrency_keys` exists on PostgreSQL
/// and MariaDB/MySQL only.
pub const PRUNED_TABLES: [&str; 6] = [
    "tenax_tasks",
    "tenax_attempts",
    "tenax_task_deps",
    "tenax_workflows",
    "tenax_concurrency_keys",
    "tenax_audit",
];

/// Rows of each of [`PRUNED_TABLES`] in the database `url` names (a table the backend
/// does not have is left out), read through a connection of its own.
pub async fn table_rows(url: &str) -> BTreeMap<&'static str, i64> {
    let mut rows = BTreeMap::new();
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(url).await.expect("open sqlite");
        for table in PRUNED_TABLES {
            if table == "tenax_concurrency_keys" {
                continue;
            }
            let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .expect("count rows");
            rows.insert(table, n);
        }
        pool.close().await;
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        let (base, schema) = match url.split_once('?') {
            Some((base, query)) => {
                let mut schema = None;
                let rest: Vec<&str> = query
                    .split('&')
                    .filter(|pair| match pair.strip_prefix("schema=") {
                        Some(name) => {
                            schema = Some(name.to_owned());
                            false
                        }
                        None => true,
                    })
                    .collect();
                (format!("{base}?{}", rest.join("&")), schema)
            }
            None => (url.to_owned(), None),
        };
        let pool = sqlx::PgPool::connect(&base).await.expect("open postgres");
        let prefix = schema.map(|s| format!("{s}.")).unwrap_or_default();
        for table in PRUNED_TABLES {
            let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {prefix}{table}"))
                .fetch_one(&pool)
                .await
                .expect("count rows");
            rows.insert(table, n);
        }
        pool.close().await;
    }
    #[cfg(feature = "mysql")]
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        let url = url.replacen("mariadb:", "mysql:", 1);
        let pool = sqlx::MySqlPool::connect(&url).await.expect("open mysql");
        for table in PRUNED_TABLES {
            let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
                .fetch_one(&pool)
                .await
                .expect("count rows");
            rows.insert(table, n);
        }
        pool.close().await;
    }
    rows
}

fn lease(task: &TaskRecord) -> Lease {
    Lease {
        id: task.id,
        epoch: task.lease_epoch,
    }
}

async fn complete(h: &Harness, task: &TaskRecord) {
    assert!(h
        .storage
        .task_complete_if_leased(&TaskCompleteParams {
            lease: lease(task),
            result: Some(r#"{"ok":true}"#.to_owned()),
            compensation: CompensationState::Succeeded,
            now: None,
        })
        .await
        .unwrap());
}

/// Claim every due task and complete it, until none is left.
async fn run_all(h: &Harness) {
    loop {
        let claimed = h.claim("w", 100, None).await;
        if claimed.is_empty() {
            return;
        }
        for task in &claimed {
            complete(h, task).await;
        }
    }
}

/// An instant a day ahead of the database clock: every task finished now is past a
/// one-hour retention then.
fn tomorrow() -> DateTime<Utc> {
    Utc::now() + TimeDelta::days(1)
}

async fn prune_tasks(h: &Harness, now: DateTime<Utc>) -> u64 {
    let mut all = 0;
    loop {
        let n = h
            .storage
            .task_prune(&TaskPruneParams {
                retention: Duration::from_secs(3_600),
                limit: 100,
                now: Some(now),
            })
            .await
            .unwrap();
        all += n;
        if n < 100 {
            return all;
        }
    }
}

async fn prune_sides(h: &Harness, now: DateTime<Utc>, audit_retention: Duration) {
    let params = SidePruneParams {
        audit_retention,
        limit: 2,
        now: Some(now),
    };
    // A small batch, called until no table fills it: the batches are bounded.
    for _ in 0..100 {
        let pruned = h.storage.side_prune(&params).await.unwrap();
        assert!(pruned.keys <= 2 && pruned.workflows <= 2 && pruned.audit <= 2);
        if !pruned.more(params.limit) {
            return;
        }
    }
    panic!("side prune still finds full batches after 100 calls");
}

fn keyed(no: &str, key: &str, i: usize) -> crate::TaskInsertParams {
    let mut task = super::bulk_insert::numbered(no, i);
    task.concurrency_key = Some(key.to_owned());
    task
}

pub async fn pruned_tasks_leave_no_side_rows_behind(h: &Harness) {
    // Two workflows whose tasks hold keys, a keyed task of its own, and audit entries.
    for name in ["one", "two"] {
        let mut flow = workflow(
            name,
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &[("a", &[]), ("b", &[]), ("c", &["a", "b"])],
        );
        for (i, task) in flow.tasks.iter_mut().enumerate() {
            task.task.concurrency_key = Some(format!("{name}-{i}"));
        }
        h.storage.workflow_insert(&flow).await.unwrap();
    }
    h.storage
        .task_insert(&keyed("solo", "solo-key", 0))
        .await
        .unwrap();
    for i in 0..5 {
        h.storage
            .audit_append(&AuditAppendParams {
                actor: "cli:alice".into(),
                action: "task.cancel".into(),
                target: format!("task-{i}"),
                details: serde_json::Value::Null,
                now: None,
            })
            .await
            .unwrap();
    }
    run_all(h).await;
    let before = table_rows(&h.url).await;
    assert_eq!(before["tenax_tasks"], 7);
    assert_eq!(before["tenax_task_deps"], 4);
    assert_eq!(before["tenax_workflows"], 2);
    assert_eq!(before["tenax_audit"], 5);
    if let Some(keys) = before.get("tenax_concurrency_keys") {
        assert_eq!(*keys, 7, "one row per key claimed");
    }
    let now = tomorrow();
    assert_eq!(prune_tasks(h, now).await, 7);
    prune_sides(h, now, Duration::from_secs(3_600)).await;
    let after = table_rows(&h.url).await;
    for (table, n) in &after {
        assert_eq!(
            *n, 0,
            "{table} is empty once its tasks are pruned: {after:?}"
        );
    }
}

pub async fn a_prune_keeps_the_side_rows_live_tasks_need(h: &Harness) {
    // A blocked child of two parents, one of which finishes and is pruned.
    let flow = workflow(
        "keep",
        WorkflowKind::Dag,
        WorkflowPolicy::CancelDependents,
        &[("p1", &[]), ("p2", &["p1"]), ("c", &["p1", "p2"])],
    );
    let detail = h.storage.workflow_insert(&flow).await.unwrap();
    let p1 = h.claim("w", 10, None).await;
    assert_eq!(p1.len(), 1);
    complete(h, &p1[0]).await;
    // Keys: one whose task runs, one whose tasks wait behind a finished one, and one
    // whose only task is done.
    h.storage
        .task_insert(&keyed("running", "k-running", 1))
        .await
        .unwrap();
    h.storage
        .task_insert(&keyed("wait-1", "k-waiting", 2))
        .await
        .unwrap();
    h.storage
        .task_insert(&keyed("wait-2", "k-waiting", 3))
        .await
        .unwrap();
    h.storage
        .task_insert(&keyed("gone", "k-gone", 4))
        .await
        .unwrap();
    let claimed = h.claim("w", 10, None).await;
    // p2, and one task per key (the limit is 1).
    let mut by_no: Vec<(String, TaskRecord)> = claimed
        .into_iter()
        .map(|t| (t.task_no.as_str().to_owned(), t))
        .collect();
    by_no.sort_by(|a, b| a.0.cmp(&b.0));
    let numbers: Vec<&str> = by_no.iter().map(|(no, _)| no.as_str()).collect();
    assert_eq!(numbers, ["gone", "keep-p2", "running", "wait-1"]);
    for (no, task) in &by_no {
        if no == "gone" || no == "wait-1" {
            complete(h, task).await;
        }
    }
    let old = Utc::now() - TimeDelta::days(10);
    for (i, at) in [old, old, Utc::now()].into_iter().enumerate() {
        h.storage
            .audit_append(&AuditAppendParams {
                actor: "cli:alice".into(),
                action: "task.cancel".into(),
                target: format!("task-{i}"),
                details: serde_json::Value::Null,
                now: Some(at),
            })
            .await
            .unwrap();
    }
    let before = table_rows(&h.url).await;
    let now = tomorrow();
    // p1, gone and wait-1 are pruned.
    assert_eq!(prune_tasks(h, now).await, 3);
    prune_sides(h, Utc::now(), Duration::from_secs(7 * 86_400)).await;
    let after = table_rows(&h.url).await;
    // The child still waits on p2: its dependency rows and the workflow stay.
    assert_eq!(after["tenax_task_deps"], before["tenax_task_deps"]);
    assert_eq!(after["tenax_task_deps"], 3);
    assert_eq!(after["tenax_workflows"], 1);
    // The entries older than the audit retention go; the newer one stays.
    assert_eq!(before["tenax_audit"], 3);
    assert_eq!(after["tenax_audit"], 1);
    if let Some(keys) = after.get("tenax_concurrency_keys") {
        // k-running (a running task) and k-waiting (a pending one) stay; k-gone goes.
        // The workflow's tasks carry no key.
        assert_eq!(before["tenax_concurrency_keys"], 3);
        assert_eq!(*keys, 2, "{after:?}");
    }
    // The child still counts p2 down, and reads the results of the parents not pruned.
    let p2 = &by_no[1].1;
    complete(h, p2).await;
    let c = detail.tasks[2].task.id;
    let child = h.storage.task_get(&TaskRef::Id(c)).await.unwrap().unwrap();
    assert_eq!(child.status, TaskStatus::Pending);
    let parents = h.storage.task_parent_results(c).await.unwrap();
    assert_eq!(parents.len(), 1, "{parents:?}");
    // The waiting keyed task still runs under its key.
    let next = h.claim("w", 10, None).await;
    let numbers: Vec<&str> = next.iter().map(|t| t.task_no.as_str()).collect();
    assert!(numbers.contains(&"wait-2"), "{numbers:?}");
}

pub async fn keyed_claims_racing_the_side_prune_never_pass_a_key_limit(h: &Harness) {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    const TASKS: usize = 120;
    const KEYS: usize = 4;
    let running: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let finished = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let keys_pruned = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    // Tasks arrive a few at a time, so a key's row is often left with no live task (and
    // pruned) just before its next task is claimed.
    let enqueuer = {
        let storage = h.reopen().await;
        tokio::spawn(async move {
            for n in 0..TASKS {
                let key = format!("key-{}", n % KEYS);
                storage
                    .task_insert(&keyed(&format!("race-{n}"), &key, n))
                    .await
                    .unwrap();
                if n % KEYS == KEYS - 1 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let pruner = {
        let storage = h.reopen().await;
        let (stop, keys_pruned) = (stop.clone(), keys_pruned.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let pruned = storage
                    .side_prune(&SidePruneParams {
                        audit_retention: Duration::from_secs(3_600),
                        limit: 100,
                        now: None,
                    })
                    .await
                    .unwrap();
                keys_pruned.fetch_add(pruned.keys, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    let mut claimers = Vec::new();
    for claimer in 0..3 {
        let storage = h.reopen().await;
        let (running, finished) = (running.clone(), finished.clone());
        claimers.push(tokio::spawn(async move {
            let params = super::claim_params(&format!("w{claimer}"), 2, None);
            while finished.load(Ordering::SeqCst) < TASKS {
                assert!(tokio::time::Instant::now() < deadline, "claims stalled");
                let batch = storage.task_claim_batch(&params).await.unwrap();
                for task in &batch {
                    let key = task.concurrency_key.clone().unwrap();
                    let mut running = running.lock().unwrap();
                    let n = running.entry(key.clone()).or_insert(0);
                    *n += 1;
                    assert!(*n <= 1, "{n} tasks of key {key} ran at once");
                }
                tokio::task::yield_now().await;
                for task in &batch {
                    if let Some(n) = running
                        .lock()
                        .unwrap()
                        .get_mut(task.concurrency_key.as_deref().unwrap())
                    {
                        *n -= 1;
                    }
                    assert!(storage
                        .task_complete_if_leased(&TaskCompleteParams {
                            lease: lease(task),
                            result: None,
                            compensation: CompensationState::Succeeded,
                            now: None,
                        })
                        .await
                        .unwrap());
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                if batch.is_empty() {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    enqueuer.await.unwrap();
    for claimer in claimers {
        claimer.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    pruner.await.unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), TASKS);
    let rows = table_rows(&h.url).await;
    if rows.contains_key("tenax_concurrency_keys") {
        assert!(
            keys_pruned.load(Ordering::SeqCst) > 0,
            "the pruner never removed a key row while claims ran"
        );
    }
}
