//! Graceful shutdown of a real `tenax worker` process: on SIGTERM it stops claiming,
//! waits out its grace period, then hands its running task back at once (retrying,
//! lease cleared, attempt refunded), and another worker process takes it immediately,
//! long before the lease would have expired.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tenax::storage::TaskRef;
use tenax::{AttemptOutcome, Client, TaskStatus};

mod support;
use support::{SpawnGuarded, Spawned};

/// Long enough that a task picked up within the test was not picked up by expiry.
const LEASE_TTL: &str = "120s";

fn worker(db: &str, bank_latency: &str) -> Spawned {
    Command::new(env!("CARGO_BIN_EXE_tenax"))
        .args([
            "--database-url",
            db,
            "worker",
            "--command",
            "BANK_OPEN_ACCOUNT",
        ])
        .args(["--lease-ttl", LEASE_TTL, "--poll-interval", "50ms"])
        .args(["--shutdown-grace", "300ms"])
        .args(["--bank-failure-rate", "0", "--bank-latency", bank_latency])
        .env("TENAX_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn_guarded("tenax worker")
}

async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_running_task_back_for_another_worker_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("tenax.db").display());
    let client = Client::connect(&db).await.unwrap();
    // One attempt only: the hand-back must not spend it.
    let task = client
        .enqueue_raw(
            "BANK_OPEN_ACCOUNT",
            &serde_json::json!({"customer": "ada", "id_card": "12345678901234567"}),
        )
        .max_attempts(1)
        .await
        .unwrap()
        .task;
    let get = |client: Client| async move {
        client
            .get(&TaskRef::Id(task.id))
            .await
            .unwrap()
            .expect("the task exists")
    };

    // The first worker's bank call takes a minute: it is mid-task at the signal.
    let mut first = worker(&db, "60s");
    let running = wait_for(
        "running on the first worker",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move { Some(get(client).await).filter(|t| t.status == TaskStatus::Running) }
        },
    )
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = wait_for("the first worker to exit", Duration::from_secs(30), || {
        let exited = first.try_wait().unwrap();
        async move { exited }
    })
    .await;
    assert!(exit.success(), "a graceful stop exits cleanly: {exit:?}");

    let back = get(client.clone()).await;
    assert_eq!(back.status, TaskStatus::Retrying, "handed back");
    assert_eq!(back.attempt, 0, "the interrupted attempt is refunded");
    assert_eq!(
        (back.lease_owner.as_deref(), back.lease_expires_at),
        (None, None)
    );
    assert!(
        back.run_at <= client.storage().now().await.unwrap(),
        "due at once"
    );

    // Another worker takes it now, not when the 120 s lease would have expired.
    let mut second = worker(&db, "10ms");
    let done = wait_for(
        "finished by the second worker",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move { Some(get(client).await).filter(|t| t.status.is_finished()) }
        },
    )
    .await;
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(done.status, TaskStatus::Succeeded);
    let lease_expiry = running.lease_expires_at.unwrap();
    assert!(
        done.finished_at.unwrap() < lease_expiry,
        "finished {} before the first lease would expire at {lease_expiry}",
        done.finished_at.unwrap()
    );
    let attempts = client.attempts(task.id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Failed);
    assert_ne!(attempts[0].worker, attempts[1].worker);
    assert_eq!(attempts[1].outcome, AttemptOutcome::Succeeded);
}
