//! SQLite-only checks: settings no other backend has.
#![allow(clippy::unwrap_used, missing_docs)]

use tenax_storage::sqlite::{SqliteConfig, SqliteStorage, Synchronous};
use tenax_storage::Storage;

#[tokio::test]
async fn an_acknowledged_enqueue_is_durable_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let storage = SqliteStorage::connect(&url).await.unwrap();
    storage.migrate().await.unwrap();
    let mut conn = storage.pool().acquire().await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(sync, 2, "synchronous=FULL");
    drop(conn);
    let fast = SqliteStorage::connect_with(
        &url,
        &SqliteConfig {
            synchronous: Synchronous::Normal,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let sync: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(fast.pool())
        .await
        .unwrap();
    assert_eq!(sync, 1, "synchronous=NORMAL only when chosen");
}

#[tokio::test]
async fn an_in_memory_database_is_refused() {
    let err = SqliteStorage::connect("sqlite::memory:").await.unwrap_err();
    assert!(err.to_string().contains("in-memory"), "{err}");
}

#[tokio::test]
async fn a_node_of_the_previous_version_starts_on_a_database_a_newer_node_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let storage = SqliteStorage::connect(&url).await.unwrap();
    storage.migrate().await.unwrap();
    // A newer node applied a migration this binary does not have.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from a newer version', TRUE, X'00', 0)",
    )
    .execute(storage.pool())
    .await
    .unwrap();
    let older = SqliteStorage::connect(&url).await.unwrap();
    older.migrate().await.expect("the older node keeps working");
    assert_eq!(older.stats().await.unwrap().total(), 0);
}

/// The write transactions of one storage queue for its writer connection in memory:
/// with no busy timeout at all, many concurrent writers still never meet
/// `SQLITE_BUSY` (each would without that queue, as two connections of one pool
/// contend for SQLite's write lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_of_one_storage_queue_in_memory_not_on_the_busy_handler() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let storage = SqliteStorage::connect_with(
        &url,
        &SqliteConfig {
            busy_timeout: std::time::Duration::ZERO,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    storage.migrate().await.unwrap();
    let storage = std::sync::Arc::new(storage);
    let writers = (0..64).map(|i| {
        let storage = storage.clone();
        tokio::spawn(async move {
            storage
                .task_insert(&tenax_storage::TaskInsertParams {
                    task_no: tenax_core::TaskNo::new(format!("W-{i}")).unwrap(),
                    command_type: "WRITE".into(),
                    payload: "{}".into(),
                    payload_version: 1,
                    queue: "default".into(),
                    priority: tenax_core::Priority::new(5).unwrap(),
                    max_attempts: 5,
                    timeout: std::time::Duration::from_secs(60),
                    run_at: tenax_storage::RunAt::Now,
                    now: None,
                    concurrency_key: None,
                    concurrency_limit: 1,
                    callback_url: None,
                    created_by: None,
                })
                .await
        })
    });
    let mut failed = Vec::new();
    for writer in writers.collect::<Vec<_>>() {
        if let Err(e) = writer.await.unwrap() {
            failed.push(e.to_string());
        }
    }
    assert!(failed.is_empty(), "writers failed: {failed:?}");
    let stored: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tenax_tasks")
        .fetch_one(storage.pool())
        .await
        .unwrap();
    assert_eq!(stored, 64);
}

#[tokio::test]
async fn the_wake_up_probe_is_on_by_default_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let on = SqliteStorage::connect(&url).await.unwrap();
    assert!(on.capabilities().cross_process_wakeups);
    let off = SqliteStorage::connect(&format!("{url}?wake_poll_ms=0"))
        .await
        .unwrap();
    assert!(!off.capabilities().cross_process_wakeups);
    let off = SqliteStorage::connect_with(
        &url,
        &SqliteConfig {
            wake_poll_interval: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!off.capabilities().cross_process_wakeups);
    // The URL parameter wins over the configuration.
    let on = SqliteStorage::connect_with(
        &format!("{url}?wake_poll_ms=10"),
        &SqliteConfig {
            wake_poll_interval: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(on.capabilities().cross_process_wakeups);
    assert!(SqliteStorage::connect(&format!("{url}?wake_poll_ms=soon"))
        .await
        .is_err());
}
