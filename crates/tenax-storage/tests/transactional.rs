//! Enqueue inside the caller's own transaction, on every backend: the task exists if
//! and only if the caller's transaction commits (single tasks and bulk).
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use tenax_storage::testing::bulk_insert::numbered;
use tenax_storage::{Storage, TaskInsertManyParams, TaskRef};

fn bulk(prefix: &str, n: usize) -> TaskInsertManyParams {
    TaskInsertManyParams {
        tasks: (0..n)
            .map(|i| numbered(&format!("{prefix}-{i}"), i))
            .collect(),
        now: None,
    }
}

/// A two-task workflow for order `order`: `ship` after `pack`.
fn flow(order: &str) -> tenax_storage::WorkflowInsertParams {
    tenax_storage::testing::workflows::workflow(
        &format!("flow-{order}"),
        tenax_storage::WorkflowKind::Dag,
        tenax_storage::WorkflowPolicy::CancelDependents,
        &[("pack", &[]), ("ship", &["pack"])],
    )
}

async fn exists(storage: &dyn Storage, no: &str) -> bool {
    storage
        .task_get(&TaskRef::No(tenax_core::TaskNo::new(no).unwrap()))
        .await
        .unwrap()
        .is_some()
}

/// One test body per backend: `$module` names the backend module, `$storage` its
/// storage type, `$harness` the harness, `$orders` the business table's DDL.
macro_rules! transactional_tests {
    ($name:ident, $module:ident, $storage:ty, $harness:path, $orders:expr, $insert_order:expr) => {
        mod $name {
            use super::*;
            use tenax_storage::$module::{enqueue_in, enqueue_many_in, enqueue_workflow_in};

            /// The harness keeps the database alive; the storage is a second
            /// connection to it, as the application's own pool would be.
            async fn open() -> Option<(tenax_storage::testing::Harness, $storage)> {
                let harness = $harness().await?;
                let storage = <$storage>::connect(&harness.url).await.unwrap();
                sqlx::query($orders).execute(storage.pool()).await.unwrap();
                Some((harness, storage))
            }

            async fn orders(storage: &$storage) -> i64 {
                sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM orders")
                    .fetch_one(storage.pool())
                    .await
                    .unwrap()
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_committed_transaction_keeps_its_tasks_and_its_rows() {
                let Some((_harness, storage)) = open().await else {
                    return;
                };
                let mut tx = storage.pool().begin().await.unwrap();
                sqlx::query($insert_order)
                    .bind("o-1")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let one = enqueue_in(&mut tx, &numbered("ship-o-1", 1)).await.unwrap();
                assert!(one.created);
                let many = enqueue_many_in(&mut tx, &bulk("pack-o-1", 500))
                    .await
                    .unwrap();
                assert!(many.iter().all(|o| o.created()));
                // Repeated inside the same transaction: the same task.
                let again = enqueue_in(&mut tx, &numbered("ship-o-1", 1)).await.unwrap();
                assert!(!again.created);
                assert_eq!(again.task.id, one.task.id);
                // A conflicting repeat is refused and the transaction can still commit.
                let mut other = numbered("ship-o-1", 1);
                other.payload = r#"{"i":2}"#.to_owned();
                assert!(matches!(
                    enqueue_in(&mut tx, &other).await,
                    Err(tenax_storage::StorageError::TaskNoConflict { .. })
                ));
                let flow = enqueue_workflow_in(&mut tx, &flow("o-1")).await.unwrap();
                tx.commit().await.unwrap();
                assert!(exists(&storage, "ship-o-1").await);
                assert!(exists(&storage, "pack-o-1-499").await);
                assert_eq!(storage.stats().await.unwrap().total(), 503);
                let stored = storage
                    .workflow_get(flow.workflow.id)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(stored.tasks.len(), 2);
                assert_eq!(stored.tasks[1].task.status, tenax_core::TaskStatus::Blocked);
                assert_eq!(orders(&storage).await, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_rolled_back_transaction_leaves_no_task_and_no_row() {
                let Some((_harness, storage)) = open().await else {
                    return;
                };
                let mut tx = storage.pool().begin().await.unwrap();
                sqlx::query($insert_order)
                    .bind("o-2")
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                assert!(
                    enqueue_in(&mut tx, &numbered("ship-o-2", 2))
                        .await
                        .unwrap()
                        .created
                );
                enqueue_many_in(&mut tx, &bulk("pack-o-2", 500))
                    .await
                    .unwrap();
                enqueue_workflow_in(&mut tx, &flow("o-2")).await.unwrap();
                tx.rollback().await.unwrap();
                assert!(storage
                    .workflow_list(&tenax_storage::WorkflowListParams {
                        before_id: None,
                        limit: 10
                    })
                    .await
                    .unwrap()
                    .is_empty());
                assert!(!exists(&storage, "ship-o-2").await);
                assert_eq!(storage.stats().await.unwrap().total(), 0);
                assert_eq!(orders(&storage).await, 0);
                // The same numbers can be enqueued afresh afterwards.
                let mut tx = storage.pool().begin().await.unwrap();
                assert!(
                    enqueue_in(&mut tx, &numbered("ship-o-2", 2))
                        .await
                        .unwrap()
                        .created
                );
                drop(tx); // dropped without commit: rolled back too
                assert!(!exists(&storage, "ship-o-2").await);
            }
        }
    };
}

#[cfg(feature = "sqlite")]
transactional_tests!(
    sqlite,
    sqlite,
    tenax_storage::sqlite::SqliteStorage,
    tenax_storage::testing::sqlite_file,
    "CREATE TABLE orders (id TEXT PRIMARY KEY)",
    "INSERT INTO orders (id) VALUES (?)"
);
#[cfg(feature = "postgres")]
transactional_tests!(
    postgres,
    postgres,
    tenax_storage::postgres::PgStorage,
    tenax_storage::testing::postgres_from_env,
    "CREATE TABLE orders (id TEXT PRIMARY KEY)",
    "INSERT INTO orders (id) VALUES ($1)"
);
#[cfg(feature = "mysql")]
transactional_tests!(
    mysql,
    mysql,
    tenax_storage::mysql::MySqlStorage,
    tenax_storage::testing::mysql_from_env,
    "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY)",
    "INSERT INTO orders (id) VALUES (?)"
);
