//! The worker: claims due tasks of the types it knows, runs them under a lease, and
//! writes each outcome with a fenced, conditional write.
//!
//! One worker is a few loops on tokio, each in a file of its own. A task flows through
//! them in this order:
//!
//! ```text
//!  claim loop ──claimed──▶ buffer ──free slot──▶ executor ──decision──▶ completer
//!  (claim.rs)  (leased,    (claim.rs)            (executor.rs,          (completer.rs)
//!               held)                             outcome.rs)                │
//!       ▲                                             │ slot freed           │ commit
//!       └───────────── slot_freed ◀───────────────────┘ when the handler     ▼
//!                                                       returns        outcome reported
//!  heartbeat (heartbeat.rs): renews every held lease — buffered, running, or with
//!  its outcome being written — in one statement per beat
//! ```
//!
//! - **claim loop** (`claim.rs`): keeps the slots busy from a bounded buffer of claimed
//!   tasks, refilled by one claim statement (most urgent first) when half empty;
//!   sleeps until the next task falls due, a wake-up or the poll interval when nothing
//!   is due; hands the buffer back at a graceful stop;
//! - **executors** (`executor.rs`): run the handler in its own task (so a panic is
//!   caught as a retryable failure), under the task's timeout, and stop it when its
//!   lease is lost or can no longer be proven (self-fencing), or at shutdown after the
//!   grace period. When the handler returns, the executor frees its slot (at most
//!   `complete_batch` outcomes wait uncommitted; past that the slot stays taken) and
//!   writes the outcome the decision (`outcome.rs`) chose;
//! - **completer** (`completer.rs`): writes the successes of many executors in one
//!   transaction ([`Storage::task_complete_many_if_leased`]); every outcome (hooks'
//!   metrics, the reported result) is reported only after the commit that holds it;
//! - **heartbeat** (`heartbeat.rs`): renews every held lease in one statement; a lease
//!   missing from the answer was lost, and its handler is stopped at once;
//! - **batch loops** (`batch.rs`): one per batch command type;
//! - **reaper** and **pruner** (optional): see [`crate::maintenance`].
//! - **scheduler** (optional): declares the worker's schedules, then fires due ticks;
//!   see [`crate::scheduler`].
//! - **services** ([`Worker::with_service`]): callbacks, alerts, the event sequencer or
//!   an application's own; stopped with the background loops, after the completer.
//!
//! Self-fencing: each attempt holds a deadline on the local monotonic clock, the
//! instant its last successful renewal was *sent* plus the lease TTL minus the fence
//! margin. The database's expiry is at least the renewal's send time plus the TTL, so a
//! handler that passes its deadline is stopped before any other worker can claim the
//! task — and its result, if any, is dropped rather than written. A buffered task whose
//! deadline passed, or whose lease was lost, is never started.
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use tenax_core::{ExecutionHook, Registry, TaskContext, TaskId};
use tenax_storage::{Lease, Storage, TaskClaimParams};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::background::BackgroundGate;
use crate::backlog::BacklogSampler;
use crate::config::WorkerConfig;
use crate::error::Error;
use crate::maintenance;

mod batch;
mod claim;
mod completer;
mod executor;
mod heartbeat;
mod outcome;

use completer::{completer_loop, PendingCompletion};
use executor::{execute, Entry};
use heartbeat::heartbeat_loop;

/// A held lease (a buffered task, a running attempt, or one writing its outcome), as
/// the heartbeat sees it.
struct Held {
    /// Self-fencing deadline, moved forward by each successful renewal.
    deadline: watch::Sender<Instant>,
    /// Cancelled when the heartbeat learns the lease is lost.
    lost: CancellationToken,
    /// Cancelled when the heartbeat learns that a cancel of the task was requested.
    cancel_requested: CancellationToken,
    /// Set once the handler has stopped and its outcome is being written: a renewal
    /// that finds the task finished is then expected, not a lost lease.
    finishing: Arc<std::sync::atomic::AtomicBool>,
    /// The attempt's context, once built: a transactional command that committed its
    /// own completion (`TaskContext::completion_committed`) is finishing too.
    context: Option<TaskContext>,
}

struct Shared {
    storage: Arc<dyn Storage>,
    registry: Registry,
    config: WorkerConfig,
    id: String,
    hooks: Vec<Arc<dyn ExecutionHook>>,
    /// Keyed by lease, not task: a stale attempt still writing its outcome and a new
    /// attempt of the same task (after a reap and re-claim) are separate entries.
    held: Mutex<HashMap<Lease, Held>>,
    /// Cancelled when running handlers must stop (shutdown grace is over).
    hard_stop: CancellationToken,
    slot_freed: Notify,
    /// Due backlog per queue, for load-aware retry policies.
    backlog: BacklogSampler,
    /// Which background queues may be claimed now.
    gate: BackgroundGate,
    /// Where successes go to be written in batches, while a completer runs.
    completer: Mutex<Option<mpsc::UnboundedSender<PendingCompletion>>>,
    /// Attempts between their start and the end of their outcome's write: a completion
    /// batch holding all of them cannot grow, and is written at once.
    in_flight: Arc<AtomicUsize>,
    /// Places for outcomes decided but not yet committed (`complete_batch` of them): a
    /// finished handler frees its slot once it holds one.
    outcomes: Arc<Semaphore>,
}

impl Shared {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Lease, Held>> {
        // A poisoned map is still consistent: entries are inserted and removed whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fence_after(&self, sent: Instant) -> Instant {
        sent + self.config.lease_ttl - self.config.fence_margin
    }

    fn completer(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<mpsc::UnboundedSender<PendingCompletion>>> {
        // A poisoned slot is still consistent: it holds a sender or nothing.
        self.completer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start a completer unless batching is off or one runs already; the caller stops
    /// it with [`Shared::stop_completer`] once no executor is left.
    fn start_completer(&self) -> Option<tokio_util::task::AbortOnDropHandle<()>> {
        if self.config.batch_linger.is_zero() {
            return None;
        }
        let mut slot = self.completer();
        if slot.is_some() {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        *slot = Some(tx);
        Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            completer_loop(
                self.storage.clone(),
                self.config.clone(),
                self.in_flight.clone(),
                rx,
            ),
        )))
    }

    /// Close the completer's channel and wait until it wrote what it holds.
    async fn stop_completer(&self, handle: Option<tokio_util::task::AbortOnDropHandle<()>>) {
        let Some(handle) = handle else {
            return;
        };
        self.completer().take();
        if let Err(e) = handle.await {
            error!("completer failed: {e}");
        }
    }
}

/// Runs the commands of a [`Registry`]: claims due tasks of the registered types, runs
/// each under a lease kept alive by heartbeats, stops a handler whose lease cannot be
/// proven in time (self-fencing), and writes every outcome with a write guarded by the
/// lease epoch.
pub struct Worker {
    shared: Arc<Shared>,
    /// Declared with [`Worker::with_schedule`] (`crate::scheduler`).
    pub(crate) schedules: Vec<tenax_core::ScheduleDef>,
    /// Started with the worker and stopped after it ([`Worker::with_service`]).
    services: Vec<Arc<dyn crate::Service>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.shared.id)
            .field("commands", &self.shared.registry)
            .finish()
    }
}

fn worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let suffix = uuid::Uuid::now_v7().simple().to_string();
    format!(
        "{host}:{}:{}",
        std::process::id(),
        &suffix[suffix.len() - 6..]
    )
}

impl Worker {
    /// A worker for the commands of `registry`, claiming from `storage`.
    pub fn new(
        storage: Arc<dyn Storage>,
        registry: Registry,
        config: WorkerConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        if registry.is_empty() {
            return Err(crate::ConfigError("the registry has no command".into()).into());
        }
        let config_outcomes = config.complete_batch as usize;
        Ok(Self {
            shared: Arc::new(Shared {
                storage,
                registry,
                config,
                id: worker_id(),
                hooks: Vec::new(),
                held: Mutex::new(HashMap::new()),
                hard_stop: CancellationToken::new(),
                slot_freed: Notify::new(),
                backlog: BacklogSampler::default(),
                gate: BackgroundGate::default(),
                completer: Mutex::new(None),
                in_flight: Arc::new(AtomicUsize::new(0)),
                outcomes: Arc::new(Semaphore::new(config_outcomes)),
            }),
            schedules: Vec::new(),
            services: Vec::new(),
        })
    }

    /// Call `hook` before and after every execution (for example the test ledger).
    pub fn with_hook(mut self, hook: Arc<dyn ExecutionHook>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.hooks.push(hook);
        }
        self
    }

    /// Run `service` beside this worker: it starts with [`Worker::run`] and is stopped
    /// after the last task's outcome is committed (see [`crate::Service`]).
    pub fn with_service(mut self, service: Arc<dyn crate::Service>) -> Self {
        self.services.push(service);
        self
    }

    /// This worker's id, recorded as lease owner: `host:pid:suffix`.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Run until `shutdown` is cancelled, then stop claiming, let running tasks finish
    /// for up to the shutdown grace, cancel the rest and hand them back (retry now).
    /// Returns when every executor has finished.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Worker {
            shared,
            schedules,
            services: companions,
        } = self;
        info!(worker = %shared.id, commands = ?shared.registry, queues = ?shared.config.queues, "worker started");
        let background = CancellationToken::new();
        let mut services = JoinSet::new();
        services.spawn(heartbeat_loop(shared.clone(), background.clone()));
        if shared.config.reaper {
            services.spawn(maintenance::reaper_loop(
                shared.storage.clone(),
                shared.config.reaper_interval,
                shared.config.lease_ttl,
                background.clone(),
            ));
        }
        if shared.config.pruner {
            services.spawn(maintenance::pruner_loop(
                shared.storage.clone(),
                shared.config.clone(),
                background.clone(),
            ));
        }
        services.spawn(crate::scheduler::scheduler_loop(
            shared.storage.clone(),
            schedules,
            shared.config.scheduler,
            shared.config.scheduler_interval,
            shared.config.missed_tick_grace,
            background.clone(),
        ));
        for service in companions {
            service.ready(shared.storage.clone()).await;
            info!(worker = %shared.id, service = service.name(), "service started");
            services.spawn(service.run(shared.storage.clone(), background.clone()));
        }

        let mut executors = JoinSet::new();
        crate::metrics::worker_started(shared.config.concurrency);
        let completer = shared.start_completer();
        for handler in shared.registry.batch_handlers() {
            executors.spawn(batch::batch_loop(shared.clone(), handler, shutdown.clone()));
        }
        claim::claim_loop(&shared, &shutdown, &mut executors).await;

        info!(worker = %shared.id, running = executors.len(), "worker stopping: no more claims");
        let drained =
            tokio::time::timeout(shared.config.shutdown_grace, drain(&mut executors)).await;
        if drained.is_err() {
            warn!(worker = %shared.id, running = executors.len(), "shutdown grace over: cancelling running tasks");
            shared.hard_stop.cancel();
            drain(&mut executors).await;
        }
        // Every executor has its outcome written: the completer holds nothing more.
        shared.stop_completer(completer).await;
        background.cancel();
        while services.join_next().await.is_some() {}
        crate::metrics::worker_stopped(shared.config.concurrency);
        info!(worker = %shared.id, "worker stopped");
        Ok(())
    }
}

impl Worker {
    /// Claim and run due tasks until none is due, then return the ids of the tasks that
    /// ran — for tests and one-shot jobs, not for serving (it does not wait for new
    /// tasks and runs no reaper or pruner).
    ///
    /// `at` overrides the database clock for the claims: with a time in the future,
    /// delayed tasks and scheduled retries up to then are due (time travel in tests).
    /// Heartbeats run while it works, as under [`Worker::run`].
    ///
    /// ```
    /// # use tenax_core::{Command, CommandError, Registry, TaskContext, TaskStatus};
    /// # use tenax_runtime::{Client, Worker, WorkerConfig};
    /// struct Double;
    /// impl Command for Double {
    ///     const TYPE: &'static str = "DOUBLE";
    ///     type Context = u32;
    ///     type Output = u32;
    ///     async fn execute(&self, n: u32, _: &TaskContext) -> Result<u32, CommandError> {
    ///         Ok(n * 2)
    ///     }
    /// }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    /// let client = Client::connect(&url).await?;
    /// let task = client.enqueue::<Double>(21).await?.task;
    /// let mut registry = Registry::new();
    /// registry.register(Double).unwrap();
    /// let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default())?;
    /// assert_eq!(worker.drain(None).await?, vec![task.id]);
    /// let done = client.get(&tenax_storage::TaskRef::Id(task.id)).await?.unwrap();
    /// assert_eq!((done.status, done.result.as_deref()), (TaskStatus::Succeeded, Some("42")));
    /// # Ok::<(), tenax_runtime::Error>(())
    /// # }).unwrap();
    /// ```
    pub async fn drain(
        &self,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Vec<TaskId>, Error> {
        let stop = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat_loop(self.shared.clone(), stop.clone()));
        let completer = self.shared.start_completer();
        let drained = self.drain_due(at).await;
        self.shared.stop_completer(completer).await;
        stop.cancel();
        let _ = heartbeat.await;
        drained
    }

    async fn drain_due(
        &self,
        at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Vec<TaskId>, Error> {
        let shared = &self.shared;
        let params = TaskClaimParams {
            worker: shared.id.clone(),
            queues: shared.config.queues.clone(),
            commands: shared.registry.single_commands(),
            limit: shared.config.concurrency,
            lease_ttl: shared.config.lease_ttl,
            now: at,
        };
        let batches = shared.registry.batch_handlers();
        let mut ran = Vec::new();
        loop {
            let mut claimed_any = false;
            if !params.commands.is_empty() {
                let sent = Instant::now();
                let tasks = shared.storage.task_claim_batch(&params).await?;
                crate::metrics::claimed(&tasks, shared.config.lease_ttl);
                if !tasks.is_empty() {
                    claimed_any = true;
                    let deadline = shared.fence_after(sent);
                    ran.extend(tasks.iter().map(|t| t.id));
                    futures::future::join_all(
                        tasks.into_iter().map(|task| {
                            execute(shared, Entry::enter(shared, task, deadline), None)
                        }),
                    )
                    .await;
                }
            }
            // Batch types: a full batch at a time, without waiting for one to fill.
            for handler in &batches {
                let sent = Instant::now();
                let tasks = shared
                    .storage
                    .task_claim_batch(&TaskClaimParams {
                        commands: vec![(handler.command_type().to_owned(), handler.version())],
                        limit: handler.max_batch(),
                        ..params.clone()
                    })
                    .await?;
                crate::metrics::claimed(&tasks, shared.config.lease_ttl);
                if !tasks.is_empty() {
                    claimed_any = true;
                    let deadline = shared.fence_after(sent);
                    ran.extend(tasks.iter().map(|t| t.id));
                    batch::run_claimed(shared, handler.clone(), tasks, deadline).await;
                }
            }
            if !claimed_any {
                return Ok(ran);
            }
        }
    }
}

async fn drain(executors: &mut JoinSet<()>) {
    while let Some(joined) = executors.join_next().await {
        if let Err(e) = joined {
            error!("executor failed: {e}");
        }
    }
}
