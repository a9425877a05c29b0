//! `tenax bench` smoke tests: every subcommand runs with tiny counts on SQLite (and on
//! PostgreSQL when `TENAX_TEST_POSTGRES_URL` is set), its `--json` answer parses and
//! its counts add up, so every task enqueued is accounted for. Timings are never
//! asserted: this machine's speed is what the subcommands measure, not what they check.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

use serde_json::Value;
use tenax_storage::testing::url_from_env;

/// Every JSON line `tenax bench ARGS --json` prints (with `--runs 2` when `runs`).
fn bench_lines(url: &str, args: &[&str], runs: bool) -> Vec<Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args(["--database-url", url, "bench"])
        .args(args)
        .args(if runs { &["--runs", "2"][..] } else { &[] })
        .arg("--json")
        .env("TENAX_LOG", "error")
        .output()
        .expect("tenax runs");
    assert!(
        output.status.success(),
        "tenax bench {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}")))
        .collect();
    assert!(!lines.is_empty(), "no JSON line: {stdout}");
    lines
}

/// The last JSON line of `tenax bench ARGS --runs 2 --json`.
fn bench(url: &str, args: &[&str]) -> Value {
    bench_lines(url, args, true).pop().unwrap()
}

/// The 0 ≤ p50 ≤ p95 ≤ p99 ≤ max of a latency figure (all present).
fn ordered_percentiles(value: &Value, key: &str) {
    let p = |q: &str| value[key][q].as_f64().unwrap_or(f64::NAN);
    assert!(
        0.0 <= p("p50") && p("p50") <= p("p95") && p("p95") <= p("p99") && p("p99") <= p("max"),
        "{key} is not a set of ordered percentiles: {value}"
    );
}

fn positive(value: &Value, key: &str) {
    let median = value[key]["median"].as_f64();
    assert!(
        median.is_some_and(|m| m > 0.0),
        "{key} is not a positive median: {value}"
    );
    assert!(value[key]["min"].as_f64() <= value[key]["max"].as_f64());
}

fn all_subcommands(url: &str, postgres: bool) {
    let drain = bench(url, &["drain", "--tasks", "120", "--concurrency", "4"]);
    assert_eq!(drain["bench"], "drain");
    assert_eq!(drain["accounted"], 240);
    positive(&drain, "tasks_per_s");
    positive(&drain, "baseline_per_s");
    positive(&drain, "ratio");

    // Fails unless every notification of both phases succeeded.
    let batch = bench(url, &["batch", "--tasks", "450", "--concurrency", "4"]);
    assert_eq!(batch["bench"], "batch");
    assert_eq!(batch["batch"], 200);
    positive(&batch, "single_per_s");
    positive(&batch, "batch_per_s");
    positive(&batch, "ratio");

    // As a library user would: one line per concurrency, each run counted by its
    // handlers and by the stats, or the command fails.
    let levels = bench_lines(
        url,
        &[
            "drain",
            "--tasks",
            "120",
            "--concurrency",
            "2,5",
            "--in-process",
        ],
        true,
    );
    assert_eq!(levels.len(), 2, "{levels:?}");
    for (line, concurrency) in levels.iter().zip([2, 5]) {
        assert_eq!(line["concurrency"], concurrency, "{line}");
        assert_eq!(line["in_process"], true);
        assert_eq!(line["accounted"], 240);
        assert_eq!(line["repeats"], 0, "{line}");
        positive(line, "tasks_per_s");
        positive(line, "db_clock_per_s");
        positive(line, "enqueue_per_s");
        positive(line, "baseline_per_s");
        positive(line, "ratio");
    }

    let in_process = bench(
        url,
        &[
            "drain",
            "--tasks",
            "50",
            "--workers",
            "2",
            "--concurrency",
            "3",
            "--in-process",
        ],
    );
    assert_eq!(in_process["accounted"], 100);
    assert_eq!(in_process["in_process"], true);

    let latency = bench_lines(
        url,
        &["latency", "--in-process", "--tasks", "25", "--rate", "200"],
        false,
    );
    let latency = &latency[0];
    assert_eq!(latency["accounted"], 25);
    assert_eq!(latency["concurrency"], 20);
    ordered_percentiles(latency, "call_to_handler_ms");
    ordered_percentiles(latency, "enqueue_to_start_ms");

    let latency = bench_lines(url, &["latency", "--tasks", "10", "--rate", "100"], false);
    assert_eq!(latency[0]["accounted"], 10);
    assert_eq!(latency[0]["in_process"], false);
    assert!(latency[0]["call_to_handler_ms"].is_null(), "{}", latency[0]);
    ordered_percentiles(&latency[0], "enqueue_to_start_ms");

    let enqueue = bench(
        url,
        &[
            "enqueue",
            "--tasks",
            "150",
            "--one-by-one",
            "10",
            "--batch",
            "40",
        ],
    );
    assert_eq!(enqueue["accounted"], 2 * (150 + 10));
    positive(&enqueue, "bulk_per_s");
    positive(&enqueue, "raw_insert_per_s");
    positive(&enqueue, "bulk_to_raw");
    // The baseline that sends its rows is PostgreSQL's alone.
    if postgres {
        positive(&enqueue, "sent_insert_per_s");
        positive(&enqueue, "bulk_to_sent");
    } else {
        assert!(enqueue["sent_insert_per_s"].is_null(), "{enqueue}");
    }

    let baseline = bench(
        url,
        &["baseline", "--tasks", "150", "--lifecycle-time", "200ms"],
    );
    assert_eq!(baseline["accounted"], 300);
    positive(&baseline, "claim_complete_per_s");
    positive(&baseline, "raw_insert_per_s");
    assert_eq!(baseline["lifecycle_per_s"].is_object(), postgres);

    let scale = bench(
        url,
        &[
            "scale",
            "--finished",
            "300",
            "--pending",
            "60",
            "--concurrency",
            "4",
        ],
    );
    assert_eq!(scale["accounted"], 2 * (300 + 2 * 60));
    positive(&scale, "ratio");

    let steady = bench(
        url,
        &[
            "steady",
            "--start-rate",
            "100",
            "--max-rate",
            "150",
            "--step-time",
            "300ms",
            "--settle",
            "10s",
        ],
    );
    // Each run offers 100 and then 125 tasks/s for 0.3 s at most, and waits for every
    // task it offered to succeed before the next run.
    let accounted = steady["accounted"].as_u64().unwrap();
    assert!((1..=2 * (40 + 40)).contains(&accounted), "{steady}");
    positive(&steady, "tasks_per_s");
    assert_eq!(steady["ratio"].is_object(), postgres);
}

#[test]
fn every_bench_subcommand_accounts_for_its_tasks_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    // The subcommands make a fresh file of their own next to nothing given here.
    let url = format!("sqlite://{}", dir.path().join("unused.db").display());
    all_subcommands(&url, false);
}

#[test]
fn every_bench_subcommand_accounts_for_its_tasks_on_postgres() {
    let Some(url) = url_from_env("TENAX_TEST_POSTGRES_URL") else {
        return;
    };
    all_subcommands(&url, true);
}
