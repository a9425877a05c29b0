//! Wake-ups across processes, on every backend: a `tenax worker` process whose poll
//! interval is one hour starts a task enqueued by another process at once, and a
//! delayed one on time, because the enqueue wakes it (PostgreSQL's `NOTIFY`, the
//! wake-up probe of SQLite and MariaDB) and the worker re-arms its timer. PostgreSQL
//! and MariaDB run when `TENAX_TEST_POSTGRES_URL` / `TENAX_TEST_MYSQL_URL` are set (CI
//! sets them and requires them).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tenax::storage::TaskRef;
use tenax::Client;
use tenax_storage::testing::{unique_name, url_from_env};

mod support;
use support::SpawnGuarded;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_enqueue_rearms_an_idle_worker_on_postgres() {
    let Some(url) = url_from_env("TENAX_TEST_POSTGRES_URL") else {
        return;
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}schema={}", unique_name("tenax_delayed"));
    another_process_enqueue_rearms_an_idle_worker(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_enqueue_rearms_an_idle_worker_on_mariadb() {
    let Some(url) = url_from_env("TENAX_TEST_MYSQL_URL") else {
        return;
    };
    let name = unique_name("tenax_delayed");
    tenax_storage::mysql::testing_database(&url, &name)
        .await
        .expect("create database");
    let url = tenax_storage::testing::with_database(&url, &name);
    another_process_enqueue_rearms_an_idle_worker(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_enqueue_rearms_an_idle_worker_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    another_process_enqueue_rearms_an_idle_worker(&url).await;
}

async fn another_process_enqueue_rearms_an_idle_worker(url: &str) {
    let client = Client::connect(url).await.unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url, "worker", "--command", "NOOP"])
        .args(["--poll-interval", "1h"])
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn_guarded("tenax worker");
    let wait_started = |id| {
        let client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let task = client.get(&TaskRef::Id(id)).await.unwrap().unwrap();
                if task.started_at.is_some() {
                    return task;
                }
                assert!(Instant::now() < deadline, "task {id} never started");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    // Ready: the worker has run a task enqueued from here (woken from this process: it
    // polls once an hour).
    let warm = client
        .enqueue_raw("NOOP", &serde_json::json!({}))
        .await
        .unwrap()
        .task;
    wait_started(warm.id).await;
    // The worker's timer is armed for nothing (or an hour); this enqueue, from another
    // process, must re-arm it.
    let task = client
        .enqueue_raw("NOOP", &serde_json::json!({}))
        .run_in(Duration::from_millis(500))
        .await
        .unwrap()
        .task;
    let started = wait_started(task.id).await;
    let late = started.started_at.unwrap() - started.run_at;
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert!(late >= chrono::TimeDelta::zero(), "started early: {late}");
    // Far below the one-hour poll; the precision itself is measured by `tenax bench
    // delayed`.
    assert!(late < chrono::TimeDelta::seconds(5), "started {late} late");
}
