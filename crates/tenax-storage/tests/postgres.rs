//! PostgreSQL-only checks: query plans, and what the insert statement decides itself.
#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use tenax_storage::postgres::{PgConfig, PgStorage};
use tenax_storage::testing::{unique_name, url_from_env};
use tenax_storage::{Storage, TaskClaimParams};

/// A migrated schema of its own on the server of `TENAX_TEST_POSTGRES_URL`, and that
/// URL (`None` when it is not set).
async fn fresh_schema(config: PgConfig) -> Option<(PgStorage, String)> {
    let url = url_from_env("TENAX_TEST_POSTGRES_URL")?;
    let separator = if url.contains('?') { '&' } else { '?' };
    let schema = unique_name("tenax_t");
    let storage = PgStorage::connect_with(&format!("{url}{separator}schema={schema}"), &config)
        .await
        .unwrap();
    storage.migrate().await.unwrap();
    Some((storage, url))
}

/// A worker claims with one statement, which PostgreSQL planned afresh at every call:
/// the generic plan of a prepared statement is kept only when its estimate is no
/// dearer than a plan for the values at hand, and with list parameters the claim's
/// never was. Planning was about half of a single-task claim. The claim's connections
/// keep one generic plan: its conditions name the parameters, not this call's values,
/// however many claims ran before.
#[tokio::test]
async fn the_claim_keeps_one_generic_plan_instead_of_planning_every_call() {
    let Some((storage, _)) = fresh_schema(PgConfig::default()).await else {
        return;
    };
    sqlx::query(
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at)
         SELECT 'T' || g, 'NOOP', '{}', 'default', 5, 'pending', 5, now(), 1000, now(), now()
         FROM generate_series(1, 5) g",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    let params = TaskClaimParams {
        worker: "w".into(),
        queues: vec!["default".into()],
        commands: vec![("NOOP".into(), 1)],
        limit: 1,
        lease_ttl: Duration::from_secs(30),
        now: None,
    };
    let mut claimed = 0;
    for _ in 0..10 {
        claimed += storage.task_claim_batch(&params).await.unwrap().len();
    }
    assert_eq!(claimed, 5, "five claims took a task each, five found none");
    // A plan made for the values holds them as constants ('{NOOP}'::text[]); the
    // generic plan holds the parameters.
    let plan = storage.explain_claim(&params).await.unwrap();
    assert!(plan.contains("ANY ($3)"), "{plan}");
    assert!(
        !plan.contains("NOOP"),
        "a plan for this call's values: {plan}"
    );
}

#[tokio::test]
async fn the_claim_scans_the_claim_index_in_order_without_sorting_the_backlog() {
    let Some((storage, _)) = fresh_schema(PgConfig::default()).await else {
        return;
    };
    // Enough rows that the planner prefers the index, as in production.
    sqlx::query(
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at)
         SELECT 'T' || g, 'NOOP', '{}', 'default', g % 10,
                CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'succeeded' END,
                5, now() - g * interval '1 second', 1000, now(), now()
         FROM generate_series(1, 20000) g",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    sqlx::query("ANALYZE tenax_tasks")
        .execute(storage.pool())
        .await
        .unwrap();
    let plan = storage
        .explain_claim(&TaskClaimParams {
            worker: "w".into(),
            queues: vec!["default".into(), "other".into()],
            commands: vec![("NOOP".into(), 1), ("OTHER".into(), 3)],
            limit: 10,
            lease_ttl: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    // The aging key's index, walked in its order (bounded by key <= now).
    assert!(
        plan.contains("Index Scan using tenax_tasks_claim_key"),
        "{plan}"
    );
    assert!(
        plan.contains("tenax_claim_key(run_at, priority) <="),
        "{plan}"
    );
    // Queue controls cost a primary-key probe per queue, not a scan.
    assert!(
        plan.contains("Index Scan using tenax_queues_pkey"),
        "{plan}"
    );
    // Keyed tasks are left to their own claim; whether one is due is a probe of their
    // partial index (empty unless keys are used), never a scan of the table.
    assert!(plan.contains("tenax_tasks_keyed_claim"), "{plan}");
    assert!(!plan.contains("Seq Scan on tenax_tasks"), "{plan}");
    // The only sort allowed is of the few candidates, above the per-queue scans.
    let lock_rows = plan.find("LockRows").unwrap();
    assert!(
        !plan[lock_rows..].contains("Sort"),
        "the backlog is sorted on every claim:\n{plan}"
    );
}

#[tokio::test]
async fn unblocking_and_cancelling_dependents_walk_indexes() {
    use tenax_storage::testing::workflows::workflow;
    use tenax_storage::{WorkflowKind, WorkflowPolicy};

    let Some((storage, _)) = fresh_schema(PgConfig::default()).await else {
        return;
    };
    // A table of finished tasks, as in production, and a 1,000-wide fan-out.
    sqlx::query(
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at)
         SELECT 'T' || g, 'NOOP', '{}', 'default', 5, 'succeeded', 5, now(), 1000, now(), now()
         FROM generate_series(1, 100000) g",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    // Other workflows' dependencies.
    sqlx::query(
        "INSERT INTO tenax_task_deps (parent_id, child_id)
         SELECT -g, -g - 1 FROM generate_series(1, 100000) g",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    let children: Vec<String> = (0..1000).map(|i| format!("c{i}")).collect();
    let mut spec: Vec<(&str, &[&str])> = vec![("root", &[])];
    let root: &[&str] = &["root"];
    spec.extend(children.iter().map(|c| (c.as_str(), root)));
    let detail = storage
        .workflow_insert(&workflow(
            "plan",
            WorkflowKind::Dag,
            WorkflowPolicy::CancelDependents,
            &spec,
        ))
        .await
        .unwrap();
    for table in ["tenax_tasks", "tenax_task_deps"] {
        sqlx::query(&format!("ANALYZE {table}"))
            .execute(storage.pool())
            .await
            .unwrap();
    }
    let plan = storage
        .explain_workflow_propagation(detail.tasks[0].task.id)
        .await
        .unwrap();
    // The parent's children through the dependency key, never a scan of either table.
    assert!(plan.contains("tenax_task_deps_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan"), "{plan}");
}

#[tokio::test]
async fn the_bulk_insert_decides_the_events_flag_without_the_row_trigger() {
    use tenax_storage::testing::bulk_insert::numbered;
    use tenax_storage::{TaskInsertManyParams, TaskInsertParams};

    let Some((storage, _)) = fresh_schema(PgConfig::default()).await else {
        return;
    };
    sqlx::query(
        "INSERT INTO tenax_event_rules (queue, command_type, created_at)
         VALUES ('covered', '', now()), ('', 'TYPED', now()), ('pair', 'PAIRED', now())",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    let task = |no: &str, queue: &str, command_type: &str| TaskInsertParams {
        queue: queue.to_owned(),
        command_type: command_type.to_owned(),
        ..numbered(no, 0)
    };
    let mut tx = storage.pool().begin().await.unwrap();
    // Counts this transaction's calls of PL/pgSQL functions (a superuser setting).
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tenax_storage::postgres::enqueue_many_in(
        &mut tx,
        &TaskInsertManyParams {
            tasks: vec![
                task("by-queue", "covered", "PLAIN"),
                task("by-type", "other", "TYPED"),
                task("by-pair", "pair", "PAIRED"),
                task("half-pair", "pair", "PLAIN"),
                task("neither", "other", "PLAIN"),
            ],
            now: None,
        },
    )
    .await
    .unwrap();
    let trigger_calls = || {
        sqlx::query_scalar::<_, i64>(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_xact_user_functions
             WHERE funcname = 'tenax_events_flag'",
        )
    };
    assert_eq!(trigger_calls().fetch_one(&mut *tx).await.unwrap(), 0);
    // An insert that leaves the flag unset still gets it from the trigger, and the
    // count above would have seen that call.
    sqlx::query(
        "INSERT INTO tenax_tasks (task_no, command_type, payload, queue, priority, status,
             max_attempts, run_at, timeout_ms, created_at, updated_at)
         VALUES ('foreign', 'PLAIN', '{}', 'covered', 5, 'pending', 3, now(), 1000, now(), now())",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    assert_eq!(trigger_calls().fetch_one(&mut *tx).await.unwrap(), 1);
    let flags: Vec<(String, bool)> =
        sqlx::query_as("SELECT task_no, events FROM tenax_tasks ORDER BY task_no")
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    let expected = [
        ("by-pair", true),
        ("by-queue", true),
        ("by-type", true),
        ("foreign", true),
        ("half-pair", false),
        ("neither", false),
    ];
    assert_eq!(
        flags,
        expected.map(|(no, on)| (no.to_owned(), on)).to_vec(),
        "events flags"
    );
    // The rule for everything covers what no other rule does.
    sqlx::query(
        "INSERT INTO tenax_event_rules (queue, command_type, created_at) VALUES ('', '', now())",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tenax_storage::postgres::enqueue_many_in(
        &mut tx,
        &TaskInsertManyParams {
            tasks: vec![task("anything", "other", "PLAIN")],
            now: None,
        },
    )
    .await
    .unwrap();
    let anything: bool =
        sqlx::query_scalar("SELECT events FROM tenax_tasks WHERE task_no = 'anything'")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert!(anything, "the rule for everything did not flag a task");
}

#[tokio::test]
async fn a_pooled_connection_the_server_closed_while_idle_is_replaced_before_use() {
    let config = PgConfig {
        max_connections: 1,
        listen: false,
        ..PgConfig::default()
    };
    let Some((storage, url)) = fresh_schema(config).await else {
        return;
    };
    let pid = || sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()");
    let first = pid().fetch_one(storage.pool()).await.unwrap();
    // The server ends the pool's one connection while it sits idle in the pool.
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(ended);
    // Idle for longer than a connection is trusted unchecked (one second): the pool
    // checks it, finds it closed, and opens another, so the call does not fail.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    storage
        .now()
        .await
        .expect("a call after the idle connection was closed");
    let second = pid().fetch_one(storage.pool()).await.unwrap();
    assert_ne!(first, second);
}
