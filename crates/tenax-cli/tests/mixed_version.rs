//! A rolling upgrade, for real: the `tenax` binary of an earlier commit of this
//! repository and the current one share one PostgreSQL and one MariaDB database, and the
//! new binary applies its migration while the old workers run.
//!
//! The earlier commit is [`PINNED`], the last one before a schema migration (the one
//! that added `tenax_tasks.created_by`). Its `tenax` is built from the repository's own
//! history on first use, into `<target>/mixed-version/` (kept for later runs), or taken
//! from `TENAX_OLD_TENAX`.
//!
//! This is part of the long tier (the build of the old binary alone takes minutes), run
//! outside CI with:
//!
//! ```sh
//! cargo test --workspace --all-features --test mixed_version -- --ignored --nocapture
//! ```
//!
//! with `TENAX_TEST_POSTGRES_URL` and `TENAX_TEST_MYSQL_URL` set as in `.ci/test`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tenax::{Client, TaskStatus};
use tenax_ledger::Ledger;

mod support;
use support::{fresh, SpawnGuarded, Spawned};

/// The last commit before migration `task_created_by` (PostgreSQL 0016, MariaDB 0014).
const PINNED: &str = "144bd77d31c37759d4873a1f599e284a6ead0a88";

/// Tasks each enqueuer sends per command type.
const PER_TYPE: usize = 100;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run_ok(command: &mut Command, what: &str) -> String {
    let out = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `tenax` binary of [`PINNED`]: `TENAX_OLD_TENAX`, else built once from the
/// repository's history (a release build of `tenax-cli` at that commit, with its own
/// `Cargo.lock`).
fn old_tenax() -> PathBuf {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.as_ref() {
        return path.clone();
    }
    if let Some(path) = std::env::var_os("TENAX_OLD_TENAX") {
        let path = PathBuf::from(path);
        *built = Some(path.clone());
        return path;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repository().join("target"))
        .join("mixed-version");
    let source = target.join(format!("src-{}", &PINNED[..12]));
    let repo = repository();
    let present = Command::new("git")
        .args(["-C"])
        .arg(&repo)
        .args(["cat-file", "-e", &format!("{PINNED}^{{commit}}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        present,
        "commit {PINNED} is not in this clone's history (a shallow clone? `git fetch --unshallow`), \
         or set TENAX_OLD_TENAX to its tenax binary"
    );
    // The pinned commit must hold fewer migrations than this tree, on both servers, or
    // the new binary would migrate nothing while the old workers run.
    for backend in ["postgres", "mysql"] {
        let folder = format!("crates/tenax-storage/migrations/{backend}/");
        let then = run_ok(
            Command::new("git").arg("-C").arg(&repo).args([
                "ls-tree",
                "--name-only",
                PINNED,
                &folder,
            ]),
            "git ls-tree",
        )
        .lines()
        .count();
        let now = std::fs::read_dir(repo.join(&folder)).unwrap().count();
        assert!(
            then < now,
            "{PINNED} holds {then} {backend} migrations and this tree {now}: pin the last commit before a migration"
        );
    }
    if !source.join("Cargo.toml").exists() {
        let partial = target.join(format!("src-{}.partial", &PINNED[..12]));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).unwrap();
        let archive = target.join("source.tar");
        run_ok(
            Command::new("git")
                .arg("-C")
                .arg(&repo)
                .args(["archive", "--format=tar", "-o"])
                .arg(&archive)
                .arg(PINNED),
            "git archive",
        );
        run_ok(
            Command::new("tar")
                .arg("-xf")
                .arg(&archive)
                .arg("-C")
                .arg(&partial),
            "tar",
        );
        std::fs::remove_file(&archive).unwrap();
        std::fs::rename(&partial, &source).unwrap();
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    eprintln!("building tenax at {PINNED} (kept in {})", target.display());
    run_ok(
        Command::new(cargo)
            .current_dir(&source)
            .args([
                "build",
                "--release",
                "--locked",
                "-p",
                "tenax-cli",
                "--bin",
                "tenax",
            ])
            .env("CARGO_TARGET_DIR", target.join("target"))
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTFLAGS"),
        "cargo build of the pinned commit",
    );
    eprintln!("built in {:.0} s", started.elapsed().as_secs_f64());
    let path = target.join("target/release/tenax");
    *built = Some(path.clone());
    path
}

/// What a worker process registers and which binary it is.
struct Worker {
    name: &'static str,
    process: Spawned,
    commands: &'static [&'static str],
    stopped: bool,
}

/// The command type of a task of this test, from its number (`old-bank-0007`).
fn command_of(task_no: &str) -> &'static str {
    match task_no.split('-').nth(1) {
        Some("noop") => "NOOP",
        Some("bank") => "BANK_OPEN_ACCOUNT",
        Some("echo") => "echo",
        _ => panic!("a task this test did not enqueue: {task_no}"),
    }
}

fn spawn_worker(
    program: &Path,
    name: &'static str,
    url: &str,
    ledger: &Path,
    commands: &'static [&'static str],
) -> Worker {
    let log = std::fs::File::create(ledger.with_file_name(format!("{name}.log"))).unwrap();
    let mut command = Command::new(program);
    command.args(["--database-url", url, "worker"]);
    for c in commands {
        command.args(["--command", c]);
    }
    let process = command
        .args(["--concurrency", "8", "--poll-interval", "50ms"])
        .args(["--bank-failure-rate", "0", "--bank-latency", "100ms"])
        .arg("--ledger")
        .arg(ledger)
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn_guarded(name);
    Worker {
        name,
        process,
        commands,
        stopped: false,
    }
}

/// SIGTERM, as a deploy stops a process, then waits for the exit.
fn terminate(worker: &mut Worker) {
    run_ok(
        Command::new("kill").args(["-TERM", &worker.process.id().to_string()]),
        "kill -TERM",
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = worker.process.try_wait().unwrap() {
            assert!(status.success(), "{} exited with {status}", worker.name);
            worker.stopped = true;
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not stop within 30 s of SIGTERM",
            worker.name
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Enqueues through the old binary, four processes at a time.
fn enqueue_with(program: &Path, url: &str, command: &str, prefix: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(4) {
        let children: Vec<_> = chunk
            .iter()
            .map(|i| {
                let payload =
                    format!(r#"{{"customer":"{prefix}{i}","id_card":"12345678901234567"}}"#);
                Command::new(program)
                    .args(["--database-url", url, "enqueue", command, &payload])
                    .args(["--no", &format!("{prefix}-{i:04}")])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "old enqueue failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

async fn wait_for(what: &str, within: Duration, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn now_us() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(now.as_micros()).unwrap()
}

async fn old_and_new_workers_share_a_database_while_the_new_binary_migrates(backend: &str) {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ONE_AT_A_TIME.lock().await;
    let Some((dir, url)) = fresh(backend, "tenax_mixed").await else {
        return;
    };
    let old = tokio::task::block_in_place(old_tenax);
    let new = PathBuf::from(env!("CARGO_BIN_EXE_tenax"));
    let ledger_path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await.unwrap();

    // The old schema, and work enqueued by the old binary.
    run_ok(
        Command::new(&old).args(["--database-url", &url, "migrate"]),
        "old migrate",
    );
    enqueue_with(&old, &url, "NOOP", "old-noop", PER_TYPE);
    enqueue_with(&old, &url, "BANK_OPEN_ACCOUNT", "old-bank", PER_TYPE);

    // Old workers, one per type; running before the migration.
    let mut old_noop = spawn_worker(&old, "old-noop", &url, &ledger_path, &["NOOP"]);
    let old_bank = spawn_worker(&old, "old-bank", &url, &ledger_path, &["BANK_OPEN_ACCOUNT"]);
    wait_for("old workers at work", Duration::from_secs(60), async || {
        ledger.executions().await.unwrap().len() >= 10
    })
    .await;

    // The new binary migrates while they run.
    let migrate_started = now_us();
    let out = run_ok(
        Command::new(&new).args(["--database-url", &url, "migrate"]),
        "new migrate",
    );
    let migrated = now_us();
    eprintln!(
        "{backend}: new migrate took {} ms while the old workers ran: {}",
        (migrated - migrate_started) / 1000,
        out.trim()
    );

    // New workers, the new binary's enqueues, and the old NOOP worker restarted: an old
    // binary started on the newer schema, as in the middle of a rolling deploy.
    let new_bank = spawn_worker(&new, "new-bank", &url, &ledger_path, &["BANK_OPEN_ACCOUNT"]);
    let new_echo = spawn_worker(&new, "new-echo", &url, &ledger_path, &["echo"]);
    let client = Client::connect(&url).await.unwrap();
    for (command, prefix) in [
        ("NOOP", "new-noop"),
        ("BANK_OPEN_ACCOUNT", "new-bank"),
        ("echo", "new-echo"),
    ] {
        for i in 0..PER_TYPE {
            client
                .enqueue_raw(
                    command,
                    &serde_json::json!({
                        "customer": format!("{prefix}{i}"),
                        "id_card": "12345678901234567"
                    }),
                )
                .task_no(format!("{prefix}-{i:04}"))
                .await
                .unwrap();
        }
    }
    terminate(&mut old_noop);
    let old_noop_again = spawn_worker(&old, "old-noop-again", &url, &ledger_path, &["NOOP"]);
    enqueue_with(&old, &url, "NOOP", "late-noop", PER_TYPE);

    // Nothing lost, nothing stuck.
    let total = PER_TYPE as u64 * 6;
    let waited = Instant::now();
    let deadline = waited + Duration::from_secs(180);
    loop {
        let stats = client.stats().await.unwrap();
        if stats.count(TaskStatus::Succeeded) == total {
            assert_eq!(stats.total(), total, "{stats:?}");
            break;
        }
        assert_eq!(stats.count(TaskStatus::Dead), 0, "{backend}: {stats:?}");
        assert!(
            Instant::now() < deadline,
            "{backend}: not every task succeeded within 180 s: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "{backend}: {total} tasks succeeded {:.1} s after the last enqueue",
        waited.elapsed().as_secs_f64()
    );

    // Each type ran only where it is registered, and the old binary worked on the new
    // schema, both across the migration and started after it.
    let workers = [old_noop, old_bank, new_bank, new_echo, old_noop_again];
    let by_pid: HashMap<u32, &Worker> = workers.iter().map(|w| (w.process.id(), w)).collect();
    let executions = ledger.executions().await.unwrap();
    let mut ran: HashMap<&str, usize> = HashMap::new();
    let mut old_bank_after_migration = 0;
    for e in &executions {
        let worker = by_pid
            .get(&e.pid)
            .unwrap_or_else(|| panic!("{} ran in unknown process {}", e.task_no, e.pid));
        let command = command_of(&e.task_no);
        assert!(
            worker.commands.contains(&command),
            "{} ({command}) ran on {}, which registers {:?}",
            e.task_no,
            worker.name,
            worker.commands
        );
        *ran.entry(worker.name).or_default() += 1;
        if worker.name == "old-bank" && e.start_us > migrated {
            old_bank_after_migration += 1;
        }
    }
    eprintln!("{backend}: executions by worker {ran:?}");
    assert!(
        ran.get("old-noop-again").copied().unwrap_or(0) > 0,
        "the old binary started after the migration ran nothing: {ran:?}"
    );
    assert!(
        old_bank_after_migration > 0,
        "the old bank worker ran nothing after the migration: {ran:?}"
    );
    assert!(ran.get("new-bank").copied().unwrap_or(0) > 0, "{ran:?}");
    let report = ledger.check().await.unwrap();
    assert!(report.is_clean(), "{:#?}", report.overlaps.first());
    assert_eq!(report.tasks, total as usize, "every task ran");
    assert!(report.open.is_empty(), "{:?}", report.open);
    let commands: HashSet<&str> = executions.iter().map(|e| command_of(&e.task_no)).collect();
    assert_eq!(commands.len(), 3, "{commands:?}");
    for mut worker in workers.into_iter().filter(|w| !w.stopped) {
        assert!(
            worker.process.try_wait().unwrap().is_none(),
            "{} exited during the run",
            worker.name
        );
        terminate(&mut worker);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long tier: builds the tenax binary of an earlier commit"]
async fn postgres_old_and_new_workers_share_a_database_while_the_new_binary_migrates() {
    old_and_new_workers_share_a_database_while_the_new_binary_migrates("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long tier: builds the tenax binary of an earlier commit"]
async fn mariadb_old_and_new_workers_share_a_database_while_the_new_binary_migrates() {
    old_and_new_workers_share_a_database_while_the_new_binary_migrates("mysql").await;
}
