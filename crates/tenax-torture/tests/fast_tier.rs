//! The fast tier of the torture battery: real worker processes, real stores, real
//! faults, checked against the external ledger. Scaled by `TENAX_TORTURE_SCALE`; a seed
//! replays with `TENAX_SEED=<n>`. Scenarios run one at a time (the box has 2 cores).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;

use tenax_torture::required;
use tenax_torture::run::{ledger_url, run, seed_from_env, Report};
use tenax_torture::tiers::{plan, scale_from_env};

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tenax-torture"))
}

/// The ledger URL, or `None` after a `SKIP` line (a failure under
/// `TENAX_REQUIRE_ALL_BACKENDS=1`).
fn ledger() -> Option<String> {
    let url = ledger_url();
    if url.is_none() {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "no ledger database (TENAX_TEST_POSTGRES_URL), but TENAX_REQUIRE_ALL_BACKENDS=1"
        );
        eprintln!("SKIP: no ledger database: set TENAX_TEST_POSTGRES_URL");
    }
    url
}

/// Whether PostgreSQL server binaries are here for a private instance.
fn private_postgres_possible() -> bool {
    required(
        tenax_torture::private_pg::find_bindir().is_some(),
        "no PostgreSQL server binaries for a private instance",
    )
}

/// Whether MariaDB server binaries are here for a private instance.
fn private_mariadb_possible() -> bool {
    required(
        tenax_torture::private_mariadb::available(),
        "no MariaDB server binaries for a private instance",
    )
}

/// Whether libfaketime is here to skew a worker's clock (Debian's `faketime`).
fn libfaketime_possible() -> bool {
    required(
        tenax_torture::fleet::libfaketime().is_some(),
        "libfaketime is not installed (apt-get install faketime)",
    )
}

async fn scenario(name: &str) -> Option<Report> {
    let url = ledger()?;
    let _one = ONE_AT_A_TIME.lock().await;
    let seed = seed_from_env();
    let mut plan = plan(name, seed, scale_from_env()).unwrap();
    // target/torture of this build, wherever the target directory is.
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    plan.report_dir = target.parent().map(|t| t.join("torture"));
    let report = run(plan, program(), &url).await.unwrap();
    print_figures(&report);
    Some(report)
}

/// The scenario's line of figures, written to the process's standard error directly:
/// the test harness captures `println!` and `eprintln!` of passing tests, and CI must
/// show the figures of a green run too.
fn print_figures(report: &Report) {
    use std::io::Write;
    let line = format!("torture: {}\n", report.summary());
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn assert_clean(report: &Report) {
    assert!(
        report.is_clean(),
        "violations (replay with TENAX_SEED={}): {}\n{:#?}",
        report.plan.seed,
        report.summary(),
        report.findings.offenders
    );
    assert!(report.findings.enqueued_ok > 0, "{}", report.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_cycles_on_sqlite_lose_nothing_and_never_run_a_task_twice_at_once() {
    let Some(r) = scenario("kill9-sqlite").await else {
        return;
    };
    assert_clean(&r);
    assert_eq!(r.injected.kills, r.plan.kills);
    assert!(
        r.findings.re_executions > 0,
        "kills must cause re-executions: {}",
        r.summary()
    );
    assert_eq!(r.findings.poison_dead_after_max, r.findings.poison_tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_cycles_on_postgres_lose_nothing_and_never_run_a_task_twice_at_once() {
    if !private_postgres_possible() {
        return;
    }
    let Some(r) = scenario("kill9-postgres").await else {
        return;
    };
    assert_clean(&r);
    assert_eq!(r.injected.kills, r.plan.kills);
    assert_eq!(r.findings.poison_dead_after_max, r.findings.poison_tasks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_crash_restarts_under_load_lose_nothing() {
    if !private_postgres_possible() {
        return;
    }
    let Some(r) = scenario("pg-restart").await else {
        return;
    };
    assert_clean(&r);
    assert_eq!(r.injected.db_restarts, r.plan.db_restarts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_faults_and_lost_commit_replies_break_no_invariant() {
    if !private_postgres_possible() {
        return;
    }
    let Some(r) = scenario("proxy").await else {
        return;
    };
    assert_clean(&r);
    let i = &r.injected;
    assert!(
        i.proxy_resets + i.proxy_blackholes + i.proxy_latency > 0,
        "{}",
        r.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_workers_write_nothing_stale_and_sigterm_hands_back() {
    let Some(r) = scenario("pause-term").await else {
        return;
    };
    assert_clean(&r);
    assert_eq!(r.injected.pauses, r.plan.pauses);
    assert_eq!(r.injected.terms_unclean, 0, "{}", r.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_keeps_memory_descriptors_and_table_flat() {
    let Some(r) = scenario("soak").await else {
        return;
    };
    assert_clean(&r);
    let s = &r.samples;
    assert!(s.len() >= 8, "too few samples: {}", s.len());
    // Warm-up: the first quarter. RSS over the last half ≤ 1.1 × its peak in the
    // second quarter (+2 MiB for allocator noise); descriptors ±5; rows bounded.
    let q = s.len() / 4;
    let early = s[q..2 * q].iter().map(|x| x.rss_kib).max().unwrap();
    let late = s[2 * q..].iter().map(|x| x.rss_kib).max().unwrap();
    assert!(
        late <= early * 11 / 10 + 2048,
        "RSS grew: {early} KiB then {late} KiB"
    );
    let fds: Vec<usize> = s[q..].iter().map(|x| x.fds).collect();
    let (lo, hi) = (fds.iter().min().unwrap(), fds.iter().max().unwrap());
    assert!(hi - lo <= 5, "descriptors moved: {lo}..{hi}");
    let peak_rows = s.iter().map(|x| x.tasks_rows).max().unwrap();
    assert!(
        (peak_rows as usize) < r.findings.enqueued_ok / 2,
        "pruning kept the table from growing: peak {peak_rows} rows of {} tasks",
        r.findings.enqueued_ok
    );
    println!(
        "soak: rss {early} -> {late} KiB, fds {lo}..{hi}, peak rows {peak_rows}, {} tasks in {:.1}s",
        r.findings.enqueued_ok, r.wall_s
    );
}

/// The checker can fail: one completion written under a stale epoch behind the lease
/// guard's back must turn the run red.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_completion_behind_the_guard_turns_the_checker_red() {
    let Some(r) = scenario("selftest-stale").await else {
        return;
    };
    assert_eq!(r.injected.stale_injections, 1, "{}", r.summary());
    assert!(!r.is_clean(), "the checker missed it: {}", r.summary());
    assert!(r.findings.stale_writes_accepted >= 1, "{}", r.summary());
    assert!(r.findings.illegal_transitions >= 1, "{}", r.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_worker_and_server_kills_lose_nothing() {
    if !private_mariadb_possible() {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "no MariaDB server tools for a private instance, but TENAX_REQUIRE_ALL_BACKENDS=1"
        );
        eprintln!("SKIP: no MariaDB server tools (mariadbd, mariadb-install-db)");
        return;
    }
    let Some(r) = scenario("mariadb").await else {
        return;
    };
    assert_clean(&r);
    assert_eq!(r.injected.db_restarts, r.plan.db_restarts);
    assert_eq!(r.findings.poison_dead_after_max, r.findings.poison_tasks);
}

/// Worker clocks skewed by ±1 h and +10 min (libfaketime), jumping between those while
/// they run: no task starts before its time by the database clock, no lease is
/// reclaimed early (that would be an unexplained re-execution).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skewed_worker_clocks_start_nothing_early_on_postgres_and_mariadb() {
    if !libfaketime_possible() {
        return;
    }
    if private_postgres_possible() {
        let Some(r) = scenario("skew-postgres").await else {
            return;
        };
        assert_clean(&r);
        assert_eq!(
            r.injected.clock_jumps,
            r.plan.clock_jumps,
            "{}",
            r.summary()
        );
    }
    if private_mariadb_possible() {
        let Some(r) = scenario("skew-mariadb").await else {
            return;
        };
        assert_clean(&r);
        assert_eq!(
            r.injected.clock_jumps,
            r.plan.clock_jumps,
            "{}",
            r.summary()
        );
    }
}

/// The database server's own clock steps an hour forward, an hour back and ten minutes
/// forward (libfaketime on a private server) while four workers run and are killed:
/// no task is lost, none runs twice at once, none starts before its run time by the
/// database's clock unless that clock stepped forward since its enqueue, and no step
/// explains a re-run (the reaper must not take a live lease after a step forward).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_clock_steps_run_no_task_twice_at_once_on_postgres_and_mariadb() {
    if !libfaketime_possible() {
        return;
    }
    for (name, possible) in [
        ("db-clock-postgres", private_postgres_possible()),
        ("db-clock-mariadb", private_mariadb_possible()),
    ] {
        if !possible {
            continue;
        }
        let Some(r) = scenario(name).await else {
            return;
        };
        assert_clean(&r);
        assert!(
            r.injected.db_clock_steps >= r.plan.db_clock_steps,
            "{}",
            r.summary()
        );
        assert!(
            r.findings.re_executions > 0 || r.injected.kills == 0,
            "{}",
            r.summary()
        );
    }
}

/// The enqueuing client killed within 3 ms after it sent a request: every lost answer
/// is resolved by reading the task number, and no acknowledged or found task is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueuer_killed_mid_request_loses_no_acknowledged_task() {
    if !private_postgres_possible() {
        return;
    }
    let Some(r) = scenario("enqueuer-kill").await else {
        return;
    };
    assert_clean(&r);
    let e = r.injected.enqueuer;
    assert_eq!(e.kills, r.plan.enqueuer_kills, "{}", r.summary());
    assert_eq!(
        e.lost_answers_present + e.lost_answers_absent,
        e.kills,
        "every kill leaves exactly one request without its answer: {}",
        r.summary()
    );
    assert_eq!(r.findings.enqueued_ok, r.plan.tasks, "{}", r.summary());
}

/// Connection resets, blackholes, latency and lost COMMIT replies between MariaDB
/// workers and their server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_faults_on_mariadb_break_no_invariant() {
    if !private_mariadb_possible() {
        assert!(
            std::env::var("TENAX_REQUIRE_ALL_BACKENDS").as_deref() != Ok("1"),
            "no MariaDB server tools for a private instance, but TENAX_REQUIRE_ALL_BACKENDS=1"
        );
        return;
    }
    let Some(r) = scenario("proxy-mariadb").await else {
        return;
    };
    assert_clean(&r);
    assert!(
        r.injected.commit_replies_dropped > 0,
        "no COMMIT reply was dropped: {}",
        r.summary()
    );
}
