//! `[retry."TYPE"]` in `tenax.toml` reaches every way in: a task enqueued without an
//! attempt budget by `tenax enqueue`, by the HTTP API of `tenax serve` or by a schedule
//! gets the table's `max_attempts`, and a `tenax worker` retries it with the table's
//! backoff instead of the command's own.
//!
//! The command is the `exec` kind running `false`: every attempt fails, retryably. Its
//! own policy (doubling from 5 s, full jitter, 5 attempts) would keep the task alive
//! for a minute; the table's (3 attempts, a fixed 400 ms, no jitter) ends it in about
//! a second, with each retry at least 400 ms after the attempt before it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::SpawnGuarded;
use tenax::storage::TaskListParams;
use tenax::{Client, TaskStatus};

const BASE: Duration = Duration::from_millis(400);
/// How much later than its backoff a retry may start (polls, a loaded machine).
const SLACK: Duration = Duration::from_millis(2500);

fn tenax(config: &std::path::Path, url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tenax"));
    command
        .arg("--config")
        .arg(config)
        .args(["--database-url", url])
        .env("TENAX_LOG", "info")
        .stdin(Stdio::null());
    command
}

fn all_tasks() -> TaskListParams {
    TaskListParams {
        limit: 100,
        ..TaskListParams::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_table_sets_the_attempt_budget_at_enqueue_and_the_backoff_in_the_worker() {
    let (dir, url) = support::fresh("sqlite", "retrycfg").await.unwrap();
    let false_program = ["/bin/false", "/usr/bin/false"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("a `false` program");
    let config = dir.path().join("tenax.toml");
    std::fs::write(
        &config,
        format!(
            "[exec.allow]\nfail = \"{false_program}\"\n\
             [retry.exec]\nbackoff = \"fixed\"\nbase = \"{}ms\"\nmax_attempts = 3\n",
            BASE.as_millis()
        ),
    )
    .unwrap();
    let status = tenax(&config, &url).arg("migrate").status().unwrap();
    assert!(status.success());

    // `tenax config check` shows the table as resolved.
    let check = tenax(&config, &url)
        .args(["config", "check"])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{shown}");
    assert!(
        shown.contains("retry.\"exec\": backoff = Fixed, base = 400ms")
            && shown.contains("max_attempts = 3"),
        "{shown}"
    );

    // Enqueued by the CLI, with no attempt budget given.
    let enqueued = tenax(&config, &url)
        .args([
            "enqueue",
            "exec",
            r#"{"program": "fail"}"#,
            "--no",
            "by-cli",
        ])
        .output()
        .unwrap();
    assert!(
        enqueued.status.success(),
        "{}",
        String::from_utf8_lossy(&enqueued.stderr)
    );

    // Enqueued through the HTTP API, with no attempt budget given; the server runs no
    // worker, so the worker below runs both.
    let serve_log = std::fs::File::create(dir.path().join("serve.log")).unwrap();
    let mut serve = tenax(&config, &url)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-workers"])
        .stdout(Stdio::piped())
        .stderr(serve_log)
        .spawn_guarded("tenax serve");
    let stdout = serve.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    })
    .await
    .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let answer = tenax_kinds::client(Duration::from_secs(30))
        .unwrap()
        .post(format!("{addr}/v1/tasks"))
        .header("content-type", "application/json")
        .body(
            serde_json::json!({
                "command_type": "exec",
                "task_no": "by-http",
                "payload": {"program": "fail"},
            })
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 201, "{:?}", answer.text().await);
    // A budget given explicitly wins over the table.
    let explicit = tenax_kinds::client(Duration::from_secs(30))
        .unwrap()
        .post(format!("{addr}/v1/tasks"))
        .header("content-type", "application/json")
        .body(
            serde_json::json!({
                "command_type": "exec",
                "task_no": "explicit",
                "max_attempts": 2,
                "payload": {"program": "fail"},
            })
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(explicit.status(), 201);

    let client = Client::connect(&url).await.unwrap();
    let budgets = |tasks: &[tenax::TaskRecord]| {
        let mut b: Vec<(String, u32)> = tasks
            .iter()
            .map(|t| (t.task_no.to_string(), t.max_attempts))
            .collect();
        b.sort();
        b
    };
    let all = client.list(&all_tasks()).await.unwrap();
    assert!(all.iter().all(|t| t.kind == tenax::TaskKind::Execute));
    assert_eq!(
        budgets(&all),
        [
            ("by-cli".to_owned(), 3),
            ("by-http".to_owned(), 3),
            ("explicit".to_owned(), 2)
        ]
    );

    // A schedule added by the CLI gives its ticks the table's budget.
    let added = tenax(&config, &url)
        .args([
            "schedules",
            "add",
            "hourly-fail",
            "exec",
            r#"{"program": "fail"}"#,
            "--every",
            "1h",
        ])
        .output()
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    let schedules = client.schedules().await.unwrap();
    assert_eq!(schedules.len(), 1);
    assert_eq!(schedules[0].def.max_attempts, 3);

    // A worker of this configuration retries them with the table's backoff.
    let mut worker = tenax(&config, &url)
        .args(["worker", "--poll-interval", "50ms"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("worker.log")).unwrap())
        .spawn_guarded("tenax worker");
    let deadline = Instant::now() + Duration::from_secs(30);
    let tasks = loop {
        // The tasks themselves (each death also enqueues a compensation task).
        let tasks: Vec<_> = client
            .list(&all_tasks())
            .await
            .unwrap()
            .into_iter()
            .filter(|t| t.kind == tenax::TaskKind::Execute)
            .collect();
        assert_eq!(tasks.len(), 3);
        if tasks.iter().all(|t| t.status == TaskStatus::Dead) {
            break tasks;
        }
        assert!(
            Instant::now() < deadline,
            "not all dead within 30 s (the command's own backoff would take a minute): {:?}\n{}",
            tasks
                .iter()
                .map(|t| (t.task_no.to_string(), t.status, t.attempt))
                .collect::<Vec<_>>(),
            std::fs::read_to_string(dir.path().join("worker.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = worker.kill();
    let _ = serve.kill();
    for task in &tasks {
        assert_eq!(task.attempt, task.max_attempts, "{}", task.task_no);
        let attempts = client.attempts(task.id).await.unwrap();
        assert_eq!(attempts.len(), task.max_attempts as usize);
        for pair in attempts.windows(2) {
            let ended = pair[0].finished_at.expect("a failed attempt has ended");
            let gap = (pair[1].started_at - ended).to_std().unwrap_or_default();
            // The fixed delay, plus a poll and a loaded machine's slack; the command's
            // own policy (full jitter below 5 s, then 10 s) lands in this window for
            // every retry of the three tasks about once in a hundred runs.
            assert!(
                gap >= BASE - Duration::from_millis(20) && gap <= BASE + SLACK,
                "{}: retried {gap:?} after a failure, the fixed backoff is {BASE:?}",
                task.task_no
            );
        }
    }
}
