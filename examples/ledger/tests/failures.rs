//! A transactional handler's error rolls its statements back and takes the ordinary
//! failure path: retried until it succeeds (one row, from the attempt that
//! succeeded), or dead and compensated by `compensate_in` in the compensation's own
//! transaction. On SQLite, PostgreSQL and MariaDB.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use example_ledger::{Backend, Entry};
use tenax::sqlx;
use tenax::storage::TaskRef;
use tenax::{
    AttemptOutcome, Client, CommandError, CompensationState, Registry, RetryPolicy, TaskContext,
    TaskRecord, TaskStatus, Worker, WorkerConfig,
};

/// Inserts its row, then fails its first `failures` attempts (or every attempt,
/// permanently); its compensation posts the reversal.
struct FlakyPost {
    failures: u32,
    permanent: bool,
}

const FLAKY: &str = "LEDGER_FLAKY_POST";

impl FlakyPost {
    fn verdict(&self, task: &TaskContext) -> Result<u32, CommandError> {
        if self.permanent {
            Err(CommandError::permanent("the bank refused the entry"))
        } else if task.attempt() <= self.failures {
            Err(CommandError::retryable("the ledger was busy"))
        } else {
            Ok(task.attempt())
        }
    }
}

macro_rules! flaky_post {
    ($module:ident, $db:ty, $insert:expr) => {
        impl tenax::$module::TransactionalCommand for FlakyPost {
            const TYPE: &'static str = FLAKY;
            type Context = Entry;
            type Output = u32;

            async fn execute_in(
                &self,
                entry: Entry,
                task: &TaskContext,
                tx: &mut sqlx::Transaction<'static, $db>,
            ) -> Result<u32, CommandError> {
                sqlx::query($insert)
                    .bind(task.task_no().as_str())
                    .bind(task.lease_epoch())
                    .bind(&entry.account)
                    .bind(entry.amount_cents)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                self.verdict(task)
            }

            async fn compensate_in(
                &self,
                entry: Entry,
                task: &TaskContext,
                tx: &mut sqlx::Transaction<'static, $db>,
            ) -> Result<(), CommandError> {
                sqlx::query($insert)
                    .bind(task.task_no().as_str())
                    .bind(task.lease_epoch())
                    .bind("reversal")
                    .bind(-entry.amount_cents)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                Ok(())
            }

            fn retry_policy(&self) -> RetryPolicy {
                RetryPolicy::fixed(Duration::from_millis(1)).with_jitter(tenax::Jitter::None)
            }
        }
    };
}

const INSERT: &str =
    "INSERT INTO ledger_entries (task_no, epoch, account, amount_cents) VALUES (?, ?, ?, ?)";
flaky_post!(sqlite, sqlx::Sqlite, INSERT);
flaky_post!(
    postgres,
    sqlx::Postgres,
    "INSERT INTO ledger_entries (task_no, epoch, account, amount_cents) VALUES ($1, $2, $3, $4)"
);
flaky_post!(mysql, sqlx::MySql, INSERT);

fn registry(backend: &Backend, command: FlakyPost) -> Registry {
    let mut registry = Registry::new();
    match backend {
        Backend::Sqlite(s) => {
            registry.register(tenax::sqlite::Transactional::new(command, s.clone()))
        }
        Backend::Postgres(s) => {
            registry.register(tenax::postgres::Transactional::new(command, s.clone()))
        }
        Backend::MySql(s) => {
            registry.register(tenax::mysql::Transactional::new(command, s.clone()))
        }
    }
    .unwrap();
    registry
}

/// What [`run`] leaves: the ledger, a client, the settled task, the ledger's rows, and
/// the database's directory (SQLite), which must outlive every use of the client.
type Ran = (
    Backend,
    Client,
    TaskRecord,
    Vec<(String, i64)>,
    Option<tempfile::TempDir>,
);

/// Run `command` on one posting until its task (and compensation) finished.
async fn run(backend: &str, command: FlakyPost) -> Option<Ran> {
    let (url, guard) = common::fresh(backend).await?;
    let ledger = Backend::open(&url).await.unwrap();
    let client = Client::new(ledger.storage());
    let entry = Entry {
        account: "ada".into(),
        amount_cents: 700,
    };
    client
        .enqueue::<tenax::sqlite::Transactional<FlakyPost>>(entry)
        .task_no("FLAKY-1")
        .max_attempts(5)
        .await
        .unwrap();
    let worker = Worker::new(
        ledger.storage(),
        registry(&ledger, command),
        WorkerConfig::default(),
    )
    .unwrap();
    let no = TaskRef::No(tenax::TaskNo::new("FLAKY-1").unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        worker.drain(None).await.unwrap();
        let task = client.get(&no).await.unwrap().unwrap();
        let settled = task.status == TaskStatus::Succeeded
            || (task.status == TaskStatus::Dead
                && task
                    .compensation
                    .is_some_and(|c| c != CompensationState::Pending));
        if settled {
            break task;
        }
        assert!(
            Instant::now() < deadline,
            "{backend}: the task did not settle: {task:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let rows = ledger.ledger().await.unwrap();
    Some((ledger, client, done, rows, guard))
}

async fn retried_errors_leave_only_the_successful_attempts_row(backend: &str) {
    let command = FlakyPost {
        failures: 2,
        permanent: false,
    };
    let Some((_ledger, client, done, rows, _dir)) = run(backend, command).await else {
        return;
    };
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.attempt, 3);
    assert_eq!(done.result.as_deref(), Some("3"));
    assert_eq!(rows, vec![("FLAKY-1".to_owned(), done.lease_epoch)]);
    let history = client.attempts(done.id).await.unwrap();
    assert_eq!(
        history.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![
            AttemptOutcome::Failed,
            AttemptOutcome::Failed,
            AttemptOutcome::Succeeded
        ]
    );
    println!("{backend}: two failed attempts rolled back, rows {rows:?}");
}

async fn a_permanent_error_leaves_nothing_and_the_compensation_commits_its_own(backend: &str) {
    let command = FlakyPost {
        failures: 0,
        permanent: true,
    };
    let Some((_ledger, _client, done, rows, _dir)) = run(backend, command).await else {
        return;
    };
    assert_eq!(done.status, TaskStatus::Dead);
    assert_eq!(done.compensation, Some(CompensationState::Succeeded));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].0.starts_with("FLAKY-1:compensate"), "{rows:?}");
    println!("{backend}: the dead attempt rolled back, the compensation posted {rows:?}");
}

macro_rules! on_every_backend {
    ($($backend:ident),*) => {
        $(
            mod $backend {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn retried_errors_leave_only_the_successful_attempts_row() {
                    super::retried_errors_leave_only_the_successful_attempts_row(
                        stringify!($backend),
                    )
                    .await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_permanent_error_leaves_nothing_and_the_compensation_commits_its_own() {
                    super::a_permanent_error_leaves_nothing_and_the_compensation_commits_its_own(
                        stringify!($backend),
                    )
                    .await;
                }
            }
        )*
    };
}

on_every_backend!(sqlite, postgres, mysql);
