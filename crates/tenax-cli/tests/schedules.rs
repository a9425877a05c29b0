//! Periodic schedules from the command line, and a fleet of worker processes firing
//! a per-second cron on one PostgreSQL database: every tick fires exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tenax::storage::TaskListParams;
use tenax::{Client, TaskStatus};
use tenax_ledger::Ledger;
use tenax_storage::testing::{unique_name, url_from_env};

mod support;
use support::{SpawnGuarded, Spawned};

fn tenax(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url])
        .args(args)
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run tenax")
}

fn ok(url: &str, args: &[&str]) -> String {
    let out = tenax(url, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "tenax {args:?} failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn refused(url: &str, args: &[&str]) -> String {
    let out = tenax(url, args);
    assert!(!out.status.success(), "tenax {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn schedules_are_added_listed_paused_resumed_and_removed_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    fn s<'a>(args: &[&'a str]) -> Vec<&'a str> {
        [&["schedules"], args].concat()
    }

    let added = ok(
        &url,
        &s(&[
            "add",
            "nightly",
            "NOOP",
            r#"{"report":"sales"}"#,
            "--cron",
            "0 30 2 * * *",
            "--timezone",
            "Europe/Paris",
            "--catch-up",
            "2",
        ]),
    );
    assert!(added.contains("added nightly"), "{added}");
    let added = ok(&url, &s(&["add", "beat", "NOOP", "--every", "30s"]));
    assert!(added.contains("added beat"), "{added}");
    let again = ok(&url, &s(&["add", "beat", "NOOP", "--every", "30s"]));
    assert!(again.contains("unchanged beat"), "{again}");

    // Invalid input says what is wrong and changes nothing.
    let before = ok(&url, &s(&["list"]));
    for (args, expected) in [
        (
            vec!["add", "bad", "NOOP", "--cron", "0 61 * * *"],
            "hour 61 is outside 0-23",
        ),
        (
            vec!["add", "bad", "NOOP", "--cron", "* * * *"],
            "has 4 fields",
        ),
        (
            vec!["add", "bad", "NOOP", "--cron", "0 0 30 2 *"],
            "never fires",
        ),
        (
            vec![
                "add",
                "bad",
                "NOOP",
                "--cron",
                "* * * * *",
                "--timezone",
                "Mars/Olympus",
            ],
            "Mars/Olympus",
        ),
        (
            vec!["add", "bad", "NOOP", "--every", "1500ms"],
            "whole number of seconds",
        ),
        (
            vec!["add", "bad name", "NOOP", "--every", "1s"],
            "schedule name",
        ),
        (
            vec!["add", "beat", "NOOP", "--every", "30s", "--catch-up", "0"],
            "catch_up",
        ),
        (vec!["add", "bad", "NOOP"], "--cron"),
    ] {
        let err = refused(&url, &s(&args));
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    assert_eq!(ok(&url, &s(&["list"])), before, "nothing changed");

    let list = ok(&url, &s(&["list"]));
    assert!(list.contains("2 schedule(s)"), "{list}");
    assert!(
        list.contains(r#"cron "0 30 2 * * *" in Europe/Paris"#) && list.contains("catch up 2"),
        "{list}"
    );
    assert!(
        list.contains("every 30s") && list.contains("skip"),
        "{list}"
    );

    let paused = ok(&url, &s(&["pause", "nightly"]));
    assert!(
        paused.contains("paused nightly") && paused.contains("next paused"),
        "{paused}"
    );
    assert!(ok(&url, &s(&["list"])).contains("paused"));
    let resumed = ok(&url, &s(&["resume", "nightly"]));
    assert!(resumed.contains("resumed nightly"), "{resumed}");
    assert!(!ok(&url, &s(&["list"])).contains("paused"));
    assert!(refused(&url, &s(&["pause", "nope"])).contains("not found"));

    assert!(ok(&url, &s(&["remove", "nightly"])).contains("removed"));
    assert!(refused(&url, &s(&["remove", "nightly"])).contains("not found"));
    let list = ok(&url, &s(&["list"]));
    assert!(
        list.contains("1 schedule(s)") && !list.contains("nightly"),
        "{list}"
    );
}

fn spawn_worker(url: &str, ledger: &Path, log: &Path) -> Spawned {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url, "worker", "--command", "NOOP"])
        .args(["--poll-interval", "50ms", "--lease-ttl", "10s"])
        .arg("--ledger")
        .arg(ledger)
        .env("TENAX_LOG", "warn,tenax_runtime::scheduler=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn_guarded("tenax worker")
}

/// The task numbers of the ticks a worker's log says it fired.
fn fired_in(log: &Path, prefix: &str) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap();
    text.lines()
        .filter(|line| line.contains("tick fired"))
        .filter_map(|line| {
            let start = line.find(prefix)?;
            let rest = &line[start..];
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '\u{1b}')
                .unwrap_or(rest.len());
            Some(rest[..end].to_owned())
        })
        .collect()
}

fn tick_of(task_no: &str, prefix: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(&task_no[prefix.len()..])
        .unwrap()
        .with_timezone(&Utc)
}

async fn wait_for(what: &str, within: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three `tenax worker` processes share PostgreSQL and each runs the scheduler; a
/// per-second cron runs for at least 20 ticks. The task numbers must cover every tick
/// from the first to the last with no gap, each tick must be fired by exactly one
/// process, and the execution ledger must show each tick's task run exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_fire_each_cron_tick_exactly_once() {
    let Some(url) = url_from_env("TENAX_TEST_POSTGRES_URL") else {
        return;
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}schema={}", unique_name("tenax_cron"));
    const TICKS: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();
    let client = Client::connect(&url).await.unwrap();
    ok(
        &url,
        &[
            "schedules",
            "add",
            "every-second",
            "NOOP",
            "--cron",
            "* * * * * *",
        ],
    );
    let logs: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("worker-{i}.log")))
        .collect();
    let workers: Vec<Spawned> = logs
        .iter()
        .map(|log| spawn_worker(&url, &ledger_path, log))
        .collect();
    let prefix = "sched:every-second:";
    let count = |client: Client| async move {
        client
            .list(&TaskListParams {
                limit: 10_000,
                ..Default::default()
            })
            .await
            .unwrap()
    };
    wait_for("enough ticks fired", Duration::from_secs(120), async || {
        count(client.clone()).await.len() >= TICKS
    })
    .await;
    client.pause_schedule("every-second").await.unwrap();
    wait_for(
        "every fired task succeeded",
        Duration::from_secs(60),
        async || {
            count(client.clone())
                .await
                .iter()
                .all(|t| t.status == TaskStatus::Succeeded)
        },
    )
    .await;
    let mut workers = workers;
    for worker in &mut workers {
        assert!(worker.try_wait().unwrap().is_none(), "a worker exited");
        worker.kill().unwrap();
        worker.wait().unwrap();
    }

    let tasks = count(client.clone()).await;
    let numbers: BTreeSet<String> = tasks.iter().map(|t| t.task_no.to_string()).collect();
    assert_eq!(numbers.len(), tasks.len());
    assert!(numbers.len() >= TICKS, "{} ticks", numbers.len());
    let ticks: Vec<DateTime<Utc>> = numbers.iter().map(|n| tick_of(n, prefix)).collect();
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "a tick is missing between {} and {}",
            pair[0],
            pair[1]
        );
    }
    for task in &tasks {
        assert_eq!(task.run_at, tick_of(task.task_no.as_str(), prefix));
    }

    // Which process fired which tick, from their logs.
    let mut fired_by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, log) in logs.iter().enumerate() {
        for task_no in fired_in(log, prefix) {
            fired_by.entry(task_no).or_default().push(i);
        }
    }
    assert_eq!(
        fired_by.keys().cloned().collect::<BTreeSet<_>>(),
        numbers,
        "the logs name every tick"
    );
    let twice: Vec<_> = fired_by.iter().filter(|(_, by)| by.len() != 1).collect();
    assert!(
        twice.is_empty(),
        "ticks fired by several processes: {twice:?}"
    );
    let mut per_process = [0usize; 3];
    for by in fired_by.values() {
        per_process[by[0]] += 1;
    }
    assert!(
        per_process.iter().filter(|n| **n > 0).count() >= 2,
        "the firing is shared: {per_process:?}"
    );

    let report = ledger.check().await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.overlaps.first());
    assert_eq!(
        report.executions,
        numbers.len(),
        "every tick ran exactly once"
    );
    assert_eq!(report.tasks, numbers.len());
    let ran: BTreeSet<String> = ledger
        .executions()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.task_no)
        .collect();
    assert_eq!(ran, numbers);
    eprintln!(
        "postgres: 3 worker processes fired {} per-second ticks, each once (fired per process: {per_process:?})",
        numbers.len()
    );
}
