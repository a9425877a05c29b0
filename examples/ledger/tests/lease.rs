//! A transactional posting whose lease was lost before it committed leaves no row; the
//! new owner's posting is the only one. On SQLite, PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use example_ledger::{Backend, Enqueued, Entry, PostEntry};
use tenax::storage::{TaskClaimParams, TaskReapParams, TaskRef};
use tenax::{
    AttemptOutcome, Client, Command, CommandError, ExecutionHook, ExecutionOutcome, HookFuture,
    TaskContext, TaskKind, TaskRecord, TaskStatus, Worker, WorkerConfig,
};
use tokio_util::sync::CancellationToken;

fn entry() -> Entry {
    Entry {
        account: "ada".into(),
        amount_cents: 250,
    }
}

fn claim(worker: &str, now: Option<chrono::DateTime<chrono::Utc>>) -> TaskClaimParams {
    TaskClaimParams {
        worker: worker.into(),
        queues: vec!["default".into()],
        commands: vec![(example_ledger::POST_ENTRY.into(), 1)],
        limit: 1,
        lease_ttl: Duration::from_secs(1),
        now,
    }
}

fn context(task: &TaskRecord) -> TaskContext {
    TaskContext::new(
        task.id,
        task.task_no.clone(),
        TaskKind::Execute,
        task.attempt,
        task.max_attempts,
        task.lease_epoch,
        task.task_no.to_string(),
        None,
        CancellationToken::new(),
    )
}

/// Run one attempt of the posting through `backend`'s adapter, as a worker would.
async fn attempt(backend: &Backend, ctx: &TaskContext) -> Result<i64, CommandError> {
    match backend {
        Backend::Sqlite(s) => {
            tenax::sqlite::Transactional::new(PostEntry::default(), s.clone())
                .execute(entry(), ctx)
                .await
        }
        Backend::Postgres(s) => {
            tenax::postgres::Transactional::new(PostEntry::default(), s.clone())
                .execute(entry(), ctx)
                .await
        }
        Backend::MySql(s) => {
            tenax::mysql::Transactional::new(PostEntry::default(), s.clone())
                .execute(entry(), ctx)
                .await
        }
    }
}

async fn task(client: &Client, no: &str) -> TaskRecord {
    client
        .get(&TaskRef::No(tenax::TaskNo::new(no).unwrap()))
        .await
        .unwrap()
        .unwrap()
}

/// The first owner's lease expires and is reaped; a second owner claims the task. The
/// first owner's attempt to commit then writes nothing; the second's commits.
async fn a_stale_owner_commits_nothing(backend: &str) {
    let Some((url, _guard)) = common::fresh(backend).await else {
        return;
    };
    let ledger = Backend::open(&url).await.unwrap();
    let storage = ledger.storage();
    let client = Client::new(storage.clone());
    client
        .enqueue::<Enqueued>(entry())
        .task_no("POST-STALE")
        .await
        .unwrap();

    let first = storage
        .task_claim_batch(&claim("first", None))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let later = storage.now().await.unwrap() + chrono::Duration::hours(1);
    let reaped = storage
        .task_reap_expired(&TaskReapParams {
            limit: 10,
            now: Some(later),
            expires_beyond: None,
        })
        .await
        .unwrap();
    assert_eq!(reaped.len(), 1, "the first lease expired and was reaped");
    let second = storage
        .task_claim_batch(&claim("second", Some(later)))
        .await
        .unwrap();
    assert_eq!(second.len(), 1);
    assert!(second[0].lease_epoch > first[0].lease_epoch);

    let stale = context(&first[0]);
    let refused = attempt(&ledger, &stale).await;
    assert!(
        matches!(&refused, Err(CommandError::Retryable(m)) if m.contains("lease lost")),
        "{refused:?}"
    );
    assert!(!stale.completion_committed());
    assert!(ledger.ledger().await.unwrap().is_empty());
    assert_eq!(
        task(&client, "POST-STALE").await.status,
        TaskStatus::Running
    );

    let owner = context(&second[0]);
    assert_eq!(attempt(&ledger, &owner).await.unwrap(), 250);
    assert!(owner.completion_committed());
    // The stale owner tries again after the new owner committed: still nothing.
    assert!(attempt(&ledger, &stale).await.is_err());

    let rows = ledger.ledger().await.unwrap();
    assert_eq!(rows, vec![("POST-STALE".to_owned(), second[0].lease_epoch)]);
    let done = task(&client, "POST-STALE").await;
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.lease_epoch, second[0].lease_epoch);
    assert_eq!(done.result.as_deref(), Some("250"));
    let history = client.attempts(done.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded],
        "{history:#?}"
    );
    println!("{backend}: stale owner refused, new owner's row is the only one: {rows:?}");
}

fn config(reaper: bool) -> WorkerConfig {
    WorkerConfig {
        lease_ttl: Duration::from_secs(1),
        heartbeat_interval: Duration::from_millis(250),
        fence_margin: Duration::from_millis(250),
        reaper,
        reaper_interval: Duration::from_millis(100),
        poll_interval: Duration::from_millis(50),
        // Long enough that the lease, not the shutdown, ends the stalled attempt.
        shutdown_grace: Duration::from_secs(60),
        ..WorkerConfig::default()
    }
}

/// Counts handler starts: a task the worker holds may still be waiting in its buffer.
#[derive(Default)]
struct Starts(std::sync::atomic::AtomicUsize);

impl ExecutionHook for Starts {
    fn before<'a>(&'a self, _: &'a TaskContext) -> HookFuture<'a> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async {})
    }

    fn after<'a>(&'a self, _: &'a TaskContext, _: ExecutionOutcome) -> HookFuture<'a> {
        Box::pin(async {})
    }
}

async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A worker stalls inside its transaction after inserting the row, past its lease: it
/// fences itself and its transaction rolls back; another worker reaps the task and
/// posts it. One row, written by the new owner's attempt.
async fn a_holder_that_loses_its_lease_mid_transaction_rolls_back(backend: &str) {
    let Some((url, _guard)) = common::fresh(backend).await else {
        return;
    };
    let stalled = Backend::open(&url).await.unwrap();
    let client = Client::new(stalled.storage());
    client
        .enqueue::<Enqueued>(entry())
        .task_no("POST-STALL")
        .await
        .unwrap();

    // The first worker's handler stays inside its transaction for an hour.
    let first = Worker::new(
        stalled.storage(),
        stalled
            .registry(PostEntry {
                hold: Duration::from_secs(3600),
            })
            .unwrap(),
        config(false),
    )
    .unwrap();
    let starts = std::sync::Arc::new(Starts::default());
    let first = first.with_hook(starts.clone());
    let stop_first = CancellationToken::new();
    let first = tokio::spawn(first.run(stop_first.clone()));
    // Its handler started: a task still in the buffer would be handed back at the stop
    // below, and nothing would stall.
    let started = wait_for("the first worker starts the handler", async || {
        let t = task(&client, "POST-STALL").await;
        (t.status == TaskStatus::Running && starts.0.load(std::sync::atomic::Ordering::SeqCst) == 1)
            .then_some(t)
    })
    .await;
    // It claims nothing more; its stalled attempt runs on until its lease ends it.
    stop_first.cancel();

    let other = Backend::open(&url).await.unwrap();
    let second = Worker::new(
        other.storage(),
        other.registry(PostEntry::default()).unwrap(),
        config(true),
    )
    .unwrap();
    let stop_second = CancellationToken::new();
    let second = tokio::spawn(second.run(stop_second.clone()));
    let done = wait_for("the second worker posts the entry", async || {
        let t = task(&client, "POST-STALL").await;
        (t.status == TaskStatus::Succeeded).then_some(t)
    })
    .await;
    tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the stalled worker stops once its attempt is fenced")
        .unwrap()
        .unwrap();
    stop_second.cancel();
    second.await.unwrap().unwrap();

    assert!(done.lease_epoch > started.lease_epoch);
    let rows = other.ledger().await.unwrap();
    assert_eq!(rows, vec![("POST-STALL".to_owned(), done.lease_epoch)]);
    let history = client.attempts(done.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded],
        "{history:#?}"
    );
    println!(
        "{backend}: the stalled attempt (epoch {}) rolled back; rows {rows:?}",
        started.lease_epoch
    );
}

macro_rules! on_every_backend {
    ($($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_stale_owner_commits_nothing() {
                    super::a_stale_owner_commits_nothing(stringify!($backend)).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_holder_that_loses_its_lease_mid_transaction_rolls_back() {
                    super::a_holder_that_loses_its_lease_mid_transaction_rolls_back(
                        stringify!($backend),
                    )
                    .await;
                }
            }
        )*
    };
}

on_every_backend!(sqlite, postgres, mysql);
