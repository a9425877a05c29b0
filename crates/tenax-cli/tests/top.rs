//! `tenax top --once` and `tenax stats` against every backend: counts per queue,
//! backlog, throughput and latency percentiles read from the database. PostgreSQL and
//! MariaDB run when their `TENAX_TEST_*_URL` is set (CI sets both and requires them).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command as Process;

use tenax::{Client, Command, CommandError, Registry, TaskContext, Worker, WorkerConfig};
use tenax_storage::testing::{unique_name, url_from_env, with_database};

struct Ping;

impl Command for Ping {
    const TYPE: &'static str = "PING";
    type Context = u32;
    type Output = ();

    async fn execute(&self, _: u32, _: &TaskContext) -> Result<(), CommandError> {
        Ok(())
    }
}

fn tenax(url: &str, args: &[&str]) -> String {
    let out = Process::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url])
        .args(args)
        .env("TENAX_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tenax {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The table row whose first cell is `first`, as its cells.
fn row(text: &str, first: &str) -> Vec<String> {
    text.lines()
        .map(|line| {
            line.split('|')
                .map(|cell| cell.trim().to_owned())
                .filter(|cell| !cell.is_empty())
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{text}"))
}

async fn views_read_the_database(url: &str) {
    let client = Client::connect(url).await.unwrap();
    for n in 0..3 {
        client.enqueue::<Ping>(n).await.unwrap();
    }
    let mut registry = Registry::new();
    registry.register(Ping).unwrap();
    let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default()).unwrap();
    assert_eq!(worker.drain(None).await.unwrap().len(), 3);
    // Left waiting: two due in `default`, one due in `mail`, one delayed.
    client.enqueue::<Ping>(10).await.unwrap();
    client.enqueue::<Ping>(11).await.unwrap();
    client.enqueue::<Ping>(12).queue("mail").await.unwrap();
    client
        .enqueue::<Ping>(13)
        .run_in(std::time::Duration::from_secs(3600))
        .await
        .unwrap();

    let frame = tenax(url, &["top", "--once"]);
    assert!(frame.contains("tenax top"), "{frame}");
    assert!(
        frame.contains("throughput: 3 tasks finished in the last 60 s"),
        "{frame}"
    );
    // queue | pending | retrying | running | blocked | backlog | oldest due
    let default = row(&frame, "default");
    assert_eq!(&default[1..6], ["3", "0", "0", "0", "2"], "{frame}");
    let mail = row(&frame, "mail");
    assert_eq!(&mail[1..6], ["1", "0", "0", "0", "1"], "{frame}");
    assert_ne!(mail[6], "—", "a due task has an age: {frame}");
    assert_eq!(row(&frame, "succeeded")[1], "3", "{frame}");
    assert_eq!(row(&frame, "PING")[1], "3", "3 latencies measured: {frame}");
    assert!(frame.contains("no running task"), "{frame}");

    let stats = tenax(url, &["stats"]);
    assert_eq!(row(&stats, "pending")[1], "4", "{stats}");
    assert_eq!(row(&stats, "mail")[5], "1", "{stats}");
    assert!(stats.contains("p95"), "{stats}");
    assert!(stats.contains("oldest due task has waited"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_stats_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    views_read_the_database(&format!("sqlite://{}", dir.path().join("t.db").display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_stats_on_postgres() {
    let Some(url) = url_from_env("TENAX_TEST_POSTGRES_URL") else {
        return;
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}schema={}", unique_name("tenax_top"));
    views_read_the_database(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_and_stats_on_mysql() {
    let Some(url) = url_from_env("TENAX_TEST_MYSQL_URL") else {
        return;
    };
    let name = unique_name("tenax_top");
    tenax_storage::mysql::testing_database(&url, &name)
        .await
        .expect("create database");
    views_read_the_database(&with_database(&url, &name)).await;
}
