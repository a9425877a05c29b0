use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax_core::{Command, CommandError, Registry, RetryPolicy, TaskContext, TaskRecord};
use tenax_ledger::Ledger;
use tenax_runtime::{Client, Worker, WorkerConfig};
use tenax_storage::{Storage, TaskRef};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the scripted handler does at each attempt (the last step repeats).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Ok,
    Retry,
    Permanent,
    Panic,
    RetryAfterMs(u64),
    SleepMs(u64),
    /// Wait until cancelled, then return a retryable error.
    WaitForCancel,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Script {
    pub steps: Vec<Step>,
    #[serde(default)]
    pub compensate_sleep_ms: u64,
}

/// Counters the scripted command shares with the test.
#[derive(Default)]
pub struct Seen {
    pub executions: AtomicUsize,
    /// Handler futures dropped (finished or aborted).
    pub dropped: AtomicUsize,
    pub cancelled: AtomicUsize,
    pub compensations: AtomicUsize,
    /// Handlers running now, and the most that ever ran at once.
    pub running: AtomicUsize,
    pub max_running: AtomicUsize,
}

pub struct Scripted {
    pub seen: Arc<Seen>,
}

impl Command for Scripted {
    const TYPE: &'static str = "SCRIPTED";
    type Context = Script;
    type Output = String;

    async fn execute(&self, script: Script, task: &TaskContext) -> Result<String, CommandError> {
        self.seen.executions.fetch_add(1, Ordering::SeqCst);
        let now_running = self.seen.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen
            .max_running
            .fetch_max(now_running, Ordering::SeqCst);
        let _dropped = DropCounter(self.seen.clone());
        let index = (task.attempt() as usize - 1).min(script.steps.len().saturating_sub(1));
        match script.steps.get(index).cloned().unwrap_or(Step::Ok) {
            Step::Ok => Ok(format!("done at attempt {}", task.attempt())),
            Step::Retry => Err(CommandError::retryable("downstream timed out")),
            Step::Permanent => Err(CommandError::permanent("invalid id card")),
            Step::Panic => panic!("handler bug"),
            Step::RetryAfterMs(ms) => Err(CommandError::retry_after(
                Duration::from_millis(ms),
                "rate limited",
            )),
            Step::SleepMs(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok("slept".into())
            }
            Step::WaitForCancel => {
                task.cancellation().cancelled().await;
                self.seen.cancelled.fetch_add(1, Ordering::SeqCst);
                Err(CommandError::retryable("cancelled"))
            }
        }
    }

    async fn compensate(&self, script: Script, _task: &TaskContext) -> Result<(), CommandError> {
        tokio::time::sleep(Duration::from_millis(script.compensate_sleep_ms)).await;
        self.seen.compensations.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::exponential(Duration::from_millis(10), Duration::from_millis(40))
    }
}

struct DropCounter(Arc<Seen>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A command with no compensation, for type-routing tests.
pub struct Other;

impl Command for Other {
    const TYPE: &'static str = "OTHER";
    type Context = ();
    type Output = ();

    async fn execute(&self, _: (), _: &TaskContext) -> Result<(), CommandError> {
        Ok(())
    }
}

pub struct Env {
    pub client: Client,
    /// The database's URL, to open more connection pools on it (as more nodes would).
    pub url: String,
    pub seen: Arc<Seen>,
    pub ledger: Ledger,
    _dir: tempfile::TempDir,
}

impl Env {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
        let client = Client::connect(&url).await.unwrap();
        let ledger = Ledger::open(&dir.path().join("ledger.db")).await.unwrap();
        Self {
            client,
            url,
            seen: Arc::new(Seen::default()),
            ledger,
            _dir: dir,
        }
    }

    pub fn storage(&self) -> Arc<dyn Storage> {
        self.client.storage().clone()
    }

    pub fn registry(&self) -> Registry {
        let mut registry = Registry::new();
        registry
            .register(Scripted {
                seen: self.seen.clone(),
            })
            .unwrap();
        registry
    }

    /// Start a worker on `storage` with `registry`; stop it with the returned token.
    pub fn start(
        &self,
        storage: Arc<dyn Storage>,
        registry: Registry,
        config: WorkerConfig,
    ) -> Running {
        let worker = Worker::new(storage, registry, config)
            .unwrap()
            .with_hook(Arc::new(self.ledger.clone()));
        let stop = CancellationToken::new();
        let handle = tokio::spawn(worker.run(stop.clone()));
        Running { stop, handle }
    }

    pub async fn enqueue(&self, steps: Vec<Step>, max_attempts: u32) -> TaskRecord {
        self.client
            .enqueue::<Scripted>(Script {
                steps,
                compensate_sleep_ms: 0,
            })
            .max_attempts(max_attempts)
            .await
            .unwrap()
            .task
    }

    pub async fn get(&self, task: &TaskRecord) -> TaskRecord {
        self.client
            .get(&TaskRef::Id(task.id))
            .await
            .unwrap()
            .unwrap()
    }

    /// Wait until the task satisfies `done`, or fail after 20 s.
    pub async fn wait_task(
        &self,
        task: &TaskRecord,
        what: &str,
        done: impl Fn(&TaskRecord) -> bool,
    ) -> TaskRecord {
        let storage = self.storage();
        let id = task.id;
        let done = &done;
        wait_for(what, || {
            let storage = storage.clone();
            async move {
                storage
                    .task_get(&TaskRef::Id(id))
                    .await
                    .unwrap()
                    .filter(|t| done(t))
            }
        })
        .await
    }

    /// The ledger shows no two overlapping executions of one task.
    pub async fn assert_no_overlap(&self) {
        let report = self.ledger.check().await.unwrap();
        assert!(report.is_clean(), "{report:#?}");
    }
}

pub struct Running {
    pub stop: CancellationToken,
    pub handle: JoinHandle<Result<(), tenax_runtime::Error>>,
}

impl Running {
    pub async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("worker stops within 30 s")
            .unwrap()
            .unwrap();
    }
}

pub fn fast() -> WorkerConfig {
    WorkerConfig::fast(Duration::from_secs(2))
}

/// Poll `check` until it returns `Some`, or panic after 20 s naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
