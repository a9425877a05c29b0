//! The worker: claims due tasks of the types it knows, runs them under a lease, and
//! writes each outcome with a fenced, conditional write.
//!
//! One worker runs these loops on tokio:
//!
//! - **claim loop**: when slots are free, claims a batch (most urgent first) of the types
//!   it knows, each up to the payload version it decodes, spawns one executor per task,
//!   then waits for the poll interval, a wake-up or a freed slot;
//! - **executors**: run the handler in its own task (so a panic is caught as a
//!   retryable failure), under the task's timeout, and stop it when its lease is lost
//!   or can no longer be proven (self-fencing), or at shutdown after the grace period;
//! - **completer**: writes the successes of many executors in one transaction
//!   ([`Storage::task_complete_many_if_leased`]); an executor frees its slot only
//!   after the batch holding its completion committed;
//! - **heartbeat**: renews every held lease in one statement; a lease missing from the
//!   answer was lost, and its handler is stopped at once;
//! - **reaper** and **pruner** (optional): see [`crate::maintenance`].
//! - **scheduler** (optional): declares the worker's schedules, then fires due ticks;
//!   see [`crate::scheduler`].
//!
//! Self-fencing: each executor holds a deadline on the local monotonic clock, the
//! instant its last successful renewal was *sent* plus the lease TTL minus the fence
//! margin. The database's expiry is at least the renewal's send time plus the TTL, so a
//! handler that passes its deadline is stopped before any other worker can claim the
//! task — and its result, if any, is dropped rather than written.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use rand::Rng;
use tenax_core::{
    CommandError, CompensationState, DynHandler, ExecutionHook, ExecutionOutcome, Registry,
    RetryPolicy, TaskContext, TaskId, TaskKind, TaskNo, TaskRecord,
};
use tenax_storage::{
    BatchCompletion, FailNext, Lease, LeaseExtendParams, Storage, StorageError, TaskClaimParams,
    TaskCompleteParams, TaskFailParams,
};
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use crate::background::BackgroundGate;
use crate::backlog::BacklogSampler;
use crate::config::WorkerConfig;
use crate::error::Error;
use crate::maintenance;
use crate::timer::next_due_wait;

mod batch;

/// A running attempt, as the heartbeat sees it.
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
}

/// A success waiting in the completer for its batch.
struct PendingCompletion {
    params: TaskCompleteParams,
    /// What was written: `Some(true)` once the batch committed with it.
    written: oneshot::Sender<Option<bool>>,
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
            }),
            schedules: Vec::new(),
        })
    }

    /// Call `hook` before and after every execution (for example the test ledger).
    pub fn with_hook(mut self, hook: Arc<dyn ExecutionHook>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.hooks.push(hook);
        }
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
        let Worker { shared, schedules } = self;
        info!(worker = %shared.id, commands = ?shared.registry, queues = ?shared.config.queues, "worker started");
        let background = CancellationToken::new();
        let mut services = JoinSet::new();
        services.spawn(heartbeat_loop(shared.clone(), background.clone()));
        if shared.config.reaper {
            services.spawn(maintenance::reaper_loop(
                shared.storage.clone(),
                shared.config.reaper_interval,
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
            background.clone(),
        ));

        let mut executors = JoinSet::new();
        crate::metrics::worker_started(shared.config.concurrency);
        let completer = shared.start_completer();
        for handler in shared.registry.batch_handlers() {
            executors.spawn(batch::batch_loop(shared.clone(), handler, shutdown.clone()));
        }
        claim_loop(&shared, &shutdown, &mut executors).await;

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
                        tasks
                            .into_iter()
                            .map(|task| execute(shared, task, deadline)),
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

async fn claim_loop(
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
    executors: &mut JoinSet<()>,
) {
    let slots = Arc::new(Semaphore::new(shared.config.concurrency as usize));
    let mut wakeups = shared.storage.wakeups();
    // Each type with the payload version it decodes: tasks of newer versions wait for a
    // worker that knows them.
    let commands = shared.registry.single_commands();
    if commands.is_empty() {
        // Only batch commands: their own loops claim.
        shutdown.cancelled().await;
        return;
    }
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        // Reap finished executors so the set does not grow.
        while let Some(joined) = executors.try_join_next() {
            if let Err(e) = joined {
                error!("executor failed: {e}");
            }
        }
        let mut free = slots.available_permits() as u32;
        let concurrency = shared.config.concurrency;
        // While tasks run, a claim waits (briefly) for half the slots, or a claim
        // batch, to be free: claims then take many tasks per statement instead of one
        // per freed slot. An idle worker claims at once.
        let want = shared.config.claim_batch.min(concurrency.div_ceil(2));
        if free > 0 && free < want && !shared.config.batch_linger.is_zero() {
            let until = Instant::now() + shared.config.batch_linger;
            while free < want {
                tokio::select! {
                    _ = shared.slot_freed.notified() => {}
                    _ = sleep_until(until) => break,
                    _ = shutdown.cancelled() => break,
                }
                free = slots.available_permits() as u32;
            }
            free = slots.available_permits() as u32;
        }
        let mut full_batch = false;
        let sent = Instant::now();
        let queues = shared
            .gate
            .queues(shared.storage.as_ref(), &shared.config)
            .await;
        if free > 0 {
            let limit = free.min(shared.config.claim_batch);
            let claimed = shared
                .storage
                .task_claim_batch(&TaskClaimParams {
                    worker: shared.id.clone(),
                    queues: queues.clone(),
                    commands: commands.clone(),
                    limit,
                    lease_ttl: shared.config.lease_ttl,
                    now: None,
                })
                .await;
            match claimed {
                Ok(tasks) => {
                    crate::metrics::claimed(&tasks, shared.config.lease_ttl);
                    failures = 0;
                    full_batch = tasks.len() as u32 == limit;
                    for task in tasks {
                        let Ok(permit) = slots.clone().try_acquire_owned() else {
                            // Cannot happen: we claimed no more than the free slots.
                            error!(task.id = %task.id, "no free slot for a claimed task; its lease will expire");
                            continue;
                        };
                        let deadline = shared.fence_after(sent);
                        let shared = shared.clone();
                        crate::metrics::slot_taken(true);
                        executors.spawn(async move {
                            execute(&shared, task, deadline).await;
                            drop(permit);
                            crate::metrics::slot_taken(false);
                            shared.slot_freed.notify_one();
                        });
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    warn!(worker = %shared.id, error = %e, "claim failed");
                }
            }
        }
        if full_batch {
            continue; // more may be due right now
        }
        let wait = if failures > 0 {
            // Back off from a failing database, with jitter so workers do not return together.
            let ceiling = shared
                .config
                .poll_interval
                .saturating_mul(1 << failures.min(5));
            rand::rng().random_range(shared.config.poll_interval..=ceiling)
        } else if free > 0 {
            // Wake up when the next delayed task is due, not at the next poll.
            next_due_wait(
                shared.storage.as_ref(),
                &shared.config,
                &queues,
                &commands,
                sent,
            )
            .await
        } else {
            shared.config.poll_interval
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = sleep(wait) => {}
            _ = wakeups.changed(), if failures == 0 => {}
            _ = shared.slot_freed.notified(), if free == 0 => {}
        }
    }
}

/// How an attempt ended, before its outcome is written.
enum Ended {
    Returned(Result<Option<String>, CommandError>),
    Panicked(String),
    TimedOut(Duration),
    /// Lease lost or unprovable: nothing may be written.
    Fenced(&'static str),
    /// Shutdown grace over.
    Stopped,
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

/// Resolves when the deadline in `rx` has passed without being moved forward.
async fn fence_deadline(mut rx: watch::Receiver<Instant>) {
    loop {
        let deadline = *rx.borrow_and_update();
        tokio::select! {
            _ = sleep_until(deadline) => {
                if *rx.borrow() <= Instant::now() {
                    return;
                }
            }
            changed = rx.changed() => {
                if changed.is_err() {
                    // Sender gone: keep the last deadline.
                    let last = *rx.borrow();
                    sleep_until(last).await;
                    return;
                }
            }
        }
    }
}

/// For a compensation, the error that killed the compensated task (read from it: the
/// compensation's own `last_error` is overwritten by its own failures).
async fn death_cause(shared: &Arc<Shared>, task: &TaskRecord) -> Option<String> {
    let parent = match (task.kind, task.parent_id) {
        (TaskKind::Compensate, Some(parent)) => parent,
        _ => return None,
    };
    match shared
        .storage
        .task_get(&tenax_storage::TaskRef::Id(parent))
        .await
    {
        Ok(Some(parent)) => parent.last_error,
        Ok(None) => None,
        Err(e) => {
            warn!(error = %e, "cannot read the compensated task; its cause is unknown to the handler");
            None
        }
    }
}

fn idempotency_key(task: &TaskRecord) -> String {
    match task.kind {
        TaskKind::Execute => task.task_no.to_string(),
        // "{parent}:compensate:{id}:{epoch}" -> "{parent}:compensate": one key per
        // compensated business number.
        TaskKind::Compensate => {
            match task.task_no.as_str().split_once(TaskNo::COMPENSATION_INFIX) {
                Some((parent, _)) => format!("{parent}:compensate"),
                None => task.task_no.to_string(),
            }
        }
    }
}

async fn execute(shared: &Arc<Shared>, task: TaskRecord, deadline: Instant) {
    let span = info_span!("task", task.id = %task.id, task.no = %task.task_no, command.r#type = %task.command_type,
                          task.kind = task.kind.as_str(), attempt = task.attempt, epoch = task.lease_epoch);
    run_attempt(shared, task, deadline).instrument(span).await;
}

async fn run_attempt(shared: &Arc<Shared>, task: TaskRecord, deadline: Instant) {
    let _in_flight = InFlight::enter(&shared.in_flight);
    let lease = Lease {
        id: task.id,
        epoch: task.lease_epoch,
    };
    let (deadline_tx, deadline_rx) = watch::channel(deadline);
    let lost = CancellationToken::new();
    let cancel_requested = CancellationToken::new();
    let finishing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    shared.held().insert(
        lease,
        Held {
            deadline: deadline_tx,
            lost: lost.clone(),
            cancel_requested: cancel_requested.clone(),
            finishing: finishing.clone(),
            context: None,
        },
    );
    // However this attempt ends (even by a panic in a hook or a retry policy, or by
    // the worker being dropped), its lease stops being renewed.
    let _held = HeldGuard {
        shared: shared.clone(),
        lease,
    };
    let cancellation = CancellationToken::new();
    let ctx = TaskContext::new(
        task.id,
        task.task_no.clone(),
        task.kind,
        task.attempt,
        task.max_attempts,
        task.lease_epoch,
        idempotency_key(&task),
        death_cause(shared, &task).await,
        cancellation.clone(),
    )
    .with_concurrency_key(task.concurrency_key.clone())
    .with_parents(Arc::new(crate::workflow::StorageParents(
        shared.storage.clone(),
    )));
    if let Some(entry) = shared.held().get_mut(&lease) {
        entry.context = Some(ctx.clone());
    }
    let Some(handler) = shared.registry.get(&task.command_type) else {
        // Cannot happen: only registered types are claimed.
        let error = "no handler registered for this command type".to_owned();
        let outcome = write_outcome(shared, lease, Decision::Fail(error, FailNext::Dead)).await;
        crate::metrics::attempt_ended(&task, outcome);
        return;
    };
    if let Some(why) = older_attempts_done(shared, lease, &lost, &deadline_rx).await {
        let how = Ending {
            cancel_requested: false,
            backlog: 0,
        };
        let decision = decide(&task, Ended::Fenced(why), &handler.retry_policy(), how);
        let outcome = write_outcome(shared, lease, decision).await;
        crate::metrics::attempt_ended(&task, outcome);
        return;
    }
    for hook in &shared.hooks {
        hook.before(&ctx).await;
    }
    debug!("attempt started");
    let started = std::time::Instant::now();
    let ended = supervise(
        shared,
        &task,
        handler.clone(),
        &ctx,
        deadline_rx,
        Tokens {
            lost: &lost,
            cancel_requested: &cancel_requested,
            cancellation: &cancellation,
        },
    )
    .await;
    crate::metrics::executed(&task, started.elapsed());
    finishing.store(true, std::sync::atomic::Ordering::SeqCst);
    let observed = match &ended {
        Ended::Returned(Ok(_)) => ExecutionOutcome::Succeeded,
        Ended::Fenced(_) => ExecutionOutcome::Fenced,
        _ => ExecutionOutcome::Failed,
    };
    for hook in &shared.hooks {
        hook.after(&ctx, observed).await;
    }
    let policy = handler.retry_policy();
    let backlog = match policy.load {
        Some(_) => {
            shared
                .backlog
                .due(shared.storage.as_ref(), &task.queue)
                .await
        }
        None => 0,
    };
    let how = Ending {
        cancel_requested: cancel_requested.is_cancelled(),
        backlog,
    };
    // A transactional command committed the task's completion with its own work:
    // whatever the supervisor saw after that commit, nothing is left to write.
    let decision = if ctx.completion_committed() {
        Decision::Committed
    } else {
        decide(&task, ended, &policy, how)
    };
    let outcome = write_outcome(shared, lease, decision).await;
    crate::metrics::attempt_ended(&task, outcome);
}

/// Wait until no older attempt of this task runs in this process. A process paused
/// past its lease (a stopped VM, a SIGSTOP) wakes up with its lease lost: its fenced
/// attempt is told to stop, and meanwhile its claim loop may take the same task again
/// under the next epoch. The new attempt starts only once the old one has returned,
/// so one process never runs a task twice at once. `None` once no older attempt is
/// left; `Some(why)` if this attempt's own lease was lost or went unrenewed meanwhile.
async fn older_attempts_done(
    shared: &Shared,
    lease: Lease,
    lost: &CancellationToken,
    deadline: &watch::Receiver<Instant>,
) -> Option<&'static str> {
    let mut told = false;
    loop {
        let older = shared
            .held()
            .keys()
            .any(|l| l.id == lease.id && l.epoch < lease.epoch);
        if !older {
            return None;
        }
        if !told {
            told = true;
            info!("an older attempt of this task is still stopping here; waiting for it");
        }
        if lost.is_cancelled() {
            return Some("lease lost");
        }
        if *deadline.borrow() <= Instant::now() {
            return Some("lease could not be renewed in time (self-fenced)");
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// Counts an attempt in [`Shared::in_flight`] until it is dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Removes an attempt's entry from the held map when the attempt ends.
struct HeldGuard {
    shared: Arc<Shared>,
    lease: Lease,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.shared.held().remove(&self.lease);
    }
}

/// The signals an attempt is supervised with.
struct Tokens<'a> {
    /// Cancelled when the lease is lost.
    lost: &'a CancellationToken,
    /// Cancelled when a cancel of the task was requested.
    cancel_requested: &'a CancellationToken,
    /// The handler's own token ([`TaskContext::cancellation`]).
    cancellation: &'a CancellationToken,
}

/// Run the handler until it returns, panics, times out, loses its lease or is stopped.
/// The handler task is aborted and awaited before this returns, so nothing of it runs
/// after its outcome is decided.
async fn supervise(
    shared: &Arc<Shared>,
    task: &TaskRecord,
    handler: Arc<dyn DynHandler>,
    ctx: &TaskContext,
    deadline: watch::Receiver<Instant>,
    tokens: Tokens<'_>,
) -> Ended {
    let Tokens {
        lost,
        cancel_requested,
        cancellation,
    } = tokens;
    let payload = task.payload.clone();
    let future = match task.kind {
        TaskKind::Execute => handler
            .execute(payload, task.payload_version, ctx.clone())
            .map(|r| r.map(Some))
            .boxed(),
        TaskKind::Compensate => handler
            .compensate(payload, task.payload_version, ctx.clone())
            .map(|r| r.map(|()| None))
            .boxed(),
    };
    // Aborted and cancelled if this future is dropped (the worker's `run` future
    // dropped by its caller): a handler never outlives the executor that fences it.
    // It runs in the task's span, so every line it logs carries the task's fields.
    let future = future.instrument(tracing::Span::current());
    let mut handle = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(future));
    let _cancel_on_drop = cancellation.clone().drop_guard();
    let timeout = Duration::from_millis(task.timeout_ms.max(1));
    let timed_out = sleep(timeout);
    tokio::pin!(timed_out);
    let fenced = fence_deadline(deadline);
    tokio::pin!(fenced);
    let mut asked_to_cancel = false;
    let ended = loop {
        tokio::select! {
            joined = &mut handle => {
                return match joined {
                    Ok(result) => Ended::Returned(result),
                    Err(e) if e.is_panic() => Ended::Panicked(panic_message(&*e.into_panic())),
                    Err(e) => Ended::Panicked(format!("handler task failed: {e}")),
                };
            }
            // A cancel of the running task: the handler decides how to stop; one that
            // ignores the request is stopped at its timeout like any other.
            _ = cancel_requested.cancelled(), if !asked_to_cancel => {
                asked_to_cancel = true;
                info!("cancel requested; signalling the handler");
                cancellation.cancel();
            }
            _ = &mut timed_out => break Ended::TimedOut(timeout),
            _ = &mut fenced => break Ended::Fenced("lease could not be renewed in time (self-fenced)"),
            _ = lost.cancelled() => break Ended::Fenced("lease lost"),
            _ = shared.hard_stop.cancelled() => break Ended::Stopped,
        }
    };
    // Ask the handler to stop, give it a moment to return on its own (half the fence
    // margin, at most 1 s, so a fenced handler still stops before its lease can
    // expire), then abort it. Whatever it returns now is ignored.
    cancellation.cancel();
    let window = (shared.config.fence_margin / 2).min(Duration::from_secs(1));
    if tokio::time::timeout(window, &mut handle).await.is_err() {
        handle.abort();
        let _ = handle.await;
    }
    ended
}

/// What an ended attempt writes.
#[derive(Debug, PartialEq)]
enum Decision {
    /// Succeeded, with its result; for a compensation, what to record on its task.
    Complete(Option<String>, CompensationState),
    /// Failed: the error to store, and what comes next.
    Fail(String, FailNext),
    /// Lease lost or unprovable: nothing may be written.
    Drop(&'static str),
    /// Succeeded, and already written by the handler's own transaction
    /// ([`TaskContext::completion_committed`]).
    Committed,
}

/// What else an ended attempt's decision depends on.
#[derive(Debug, Clone, Copy, Default)]
struct Ending {
    /// A cancel of the task was requested while it ran.
    cancel_requested: bool,
    /// The due backlog of the task's queue (for a load-aware policy).
    backlog: u64,
}

/// Decide what an ended attempt writes. A transient failure (retryable error, panic,
/// timeout) is retried after the policy's delay while attempts remain, else the task
/// is dead; a permanent error kills it at once. After a cancel request, what would be
/// retried ends the task `cancelled` instead.
fn decide(task: &TaskRecord, ended: Ended, policy: &RetryPolicy, how: Ending) -> Decision {
    let transient = |message: String, delay: Duration| {
        if how.cancel_requested {
            Decision::Fail(format!("cancelled: {message}"), FailNext::Cancelled)
        } else if task.attempt < task.max_attempts {
            Decision::Fail(message, FailNext::Retry(delay))
        } else {
            let message = format!(
                "{message} (attempt {} of {}: no attempts left)",
                task.attempt, task.max_attempts
            );
            Decision::Fail(message, FailNext::Dead)
        }
    };
    let backoff = || policy.delay_under_load(task.attempt, how.backlog, &mut rand::rng());
    match ended {
        Ended::Returned(Ok(result)) => Decision::Complete(result, CompensationState::Succeeded),
        Ended::Returned(Err(CommandError::NoCompensation)) if task.kind == TaskKind::Compensate => {
            Decision::Complete(None, CompensationState::None)
        }
        Ended::Returned(Err(e @ CommandError::RetryAfter { after, .. })) => {
            transient(e.to_string(), policy.clamp_retry_after(after))
        }
        Ended::Returned(Err(e)) if e.is_retryable() => transient(e.to_string(), backoff()),
        Ended::Returned(Err(e)) => Decision::Fail(e.to_string(), FailNext::Dead),
        Ended::Panicked(message) => transient(format!("handler panicked: {message}"), backoff()),
        Ended::TimedOut(after) => transient(format!("timed out after {after:?}"), backoff()),
        // Handed back: retried at once, and the interrupted attempt is refunded.
        Ended::Stopped => Decision::Fail(
            "worker shut down before the attempt finished".into(),
            FailNext::HandBack,
        ),
        Ended::Fenced(why) => Decision::Drop(why),
    }
}

/// Write what an ended attempt decided; returns what was written, for the metrics.
async fn write_outcome(
    shared: &Arc<Shared>,
    lease: Lease,
    decision: Decision,
) -> crate::metrics::Outcome {
    use crate::metrics::Outcome;
    let (written, outcome) = match decision {
        Decision::Complete(result, compensation) => {
            let none = compensation == CompensationState::None;
            let written = write_complete(shared, lease, result, compensation).await;
            (
                written,
                Outcome::Succeeded {
                    compensation_none: none,
                },
            )
        }
        Decision::Fail(error, next) => {
            let outcome = match next {
                FailNext::Retry(_) => Outcome::Retried,
                FailNext::Dead => Outcome::Dead,
                FailNext::HandBack => Outcome::HandedBack,
                FailNext::Cancelled => Outcome::Cancelled,
            };
            (write_fail(shared, lease, error, next).await, outcome)
        }
        Decision::Committed => {
            debug!("attempt recorded by its own transaction");
            (
                Some(true),
                Outcome::Succeeded {
                    compensation_none: false,
                },
            )
        }
        Decision::Drop(why) => {
            warn!(reason = why, "handler stopped; its outcome is dropped, the task will be retried after the lease expires");
            (Some(false), Outcome::Dropped)
        }
    };
    match written {
        Some(true) => outcome,
        Some(false) => Outcome::Dropped,
        None => Outcome::Unwritten,
    }
}

async fn write_complete(
    shared: &Arc<Shared>,
    lease: Lease,
    result: Option<String>,
    compensation: CompensationState,
) -> Option<bool> {
    let params = TaskCompleteParams {
        lease,
        result,
        compensation,
        now: None,
    };
    let completer = shared.completer().clone();
    if let Some(completer) = completer {
        let (tx, rx) = oneshot::channel();
        let pending = PendingCompletion {
            params: params.clone(),
            written: tx,
        };
        let queued = completer.send(pending).is_ok();
        drop(completer);
        if queued {
            match rx.await {
                Ok(written) => {
                    report_write(written, "succeeded");
                    return written;
                }
                // The completer stopped with this success unanswered: whether its
                // batch committed is unknown, and the write below (fenced by the
                // epoch) lands only if it did not.
                Err(_) => {
                    warn!("the completion batch ended without an answer; writing the outcome alone")
                }
            }
        }
    }
    let written = with_retries(shared.config.lease_ttl, lease, || {
        shared.storage.task_complete_if_leased(&params)
    })
    .await;
    report_write(written, "succeeded");
    written
}

async fn write_fail(
    shared: &Arc<Shared>,
    lease: Lease,
    error: String,
    next: FailNext,
) -> Option<bool> {
    let params = TaskFailParams {
        lease,
        error,
        next,
        now: None,
    };
    let written = with_retries(shared.config.lease_ttl, lease, || {
        shared.storage.task_fail_if_leased(&params)
    })
    .await;
    let what = match next {
        FailNext::Retry(_) => "failed, will retry",
        FailNext::Dead => "failed, dead",
        FailNext::HandBack => "handed back",
        FailNext::Cancelled => "cancelled",
    };
    report_write(written, what);
    written
}

fn report_write(written: Option<bool>, what: &str) {
    match written {
        Some(true) => debug!(outcome = what, "attempt recorded"),
        Some(false) => warn!(
            outcome = what,
            "lease lost before the outcome was written; outcome dropped"
        ),
        None => warn!(
            outcome = what,
            "could not write the outcome; the lease will expire and the task be retried"
        ),
    }
}

/// Retry a fenced write on transient storage errors while the lease can still be held.
/// A failure of Tenax's own write is never recorded as a failure of the handler.
async fn with_retries<F, Fut>(lease_ttl: Duration, lease: Lease, mut write: F) -> Option<bool>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StorageError>>,
{
    let give_up = Instant::now() + lease_ttl;
    let mut pause = Duration::from_millis(50);
    loop {
        match write().await {
            Ok(written) => return Some(written),
            Err(e) if e.is_transient() && Instant::now() + pause < give_up => {
                warn!(task.id = %lease.id, error = %e, "writing the outcome failed; retrying");
                let jittered = rand::rng().random_range(pause / 2..=pause);
                sleep(jittered).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                error!(task.id = %lease.id, error = %e, "writing the outcome failed; giving up");
                return None;
            }
        }
    }
}

/// Collects successes and writes each batch in one transaction: a batch is written
/// when it holds `complete_batch` successes, when every attempt in flight has joined
/// it, or `batch_linger` after its first success arrived. Each success is answered
/// only after its batch committed; if the batch fails, each of its successes is
/// written alone (with retries), so none is dropped or reported before its commit.
/// Ends when the channel is closed and empty.
async fn completer_loop(
    storage: Arc<dyn Storage>,
    config: WorkerConfig,
    in_flight: Arc<AtomicUsize>,
    mut rx: mpsc::UnboundedReceiver<PendingCompletion>,
) {
    let max = config.complete_batch.max(1) as usize;
    let mut params = Vec::with_capacity(max);
    let mut answers = Vec::with_capacity(max);
    while let Some(first) = rx.recv().await {
        params.push(first.params);
        answers.push(first.written);
        let until = Instant::now() + config.batch_linger;
        while params.len() < max {
            let next = match rx.try_recv() {
                Ok(next) => next,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    if params.len() >= in_flight.load(Ordering::SeqCst) {
                        break; // every running attempt is in this batch
                    }
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(next)) => next,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            params.push(next.params);
            answers.push(next.written);
        }
        let written = write_batch(storage.as_ref(), config.lease_ttl, &params).await;
        for (answer, written) in answers.drain(..).zip(written) {
            // An executor that stopped waiting has nothing left to report.
            let _ = answer.send(written);
        }
        params.clear();
    }
}

/// Write one batch of successes; what was written for each, in order. A success the
/// batch left alone (a workflow task or a compensation) is then written by its own
/// transaction.
async fn write_batch(
    storage: &dyn Storage,
    lease_ttl: Duration,
    params: &[TaskCompleteParams],
) -> Vec<Option<bool>> {
    let answers = match storage.task_complete_many_if_leased(params).await {
        Ok(answers) if answers.len() == params.len() => answers,
        Ok(answers) => {
            error!(
                size = params.len(),
                answers = answers.len(),
                "the completion batch answered for another number of tasks; writing each alone"
            );
            return write_each(storage, lease_ttl, params.iter()).await;
        }
        Err(e) => {
            warn!(size = params.len(), error = %e, "the completion batch failed; writing each alone");
            return write_each(storage, lease_ttl, params.iter()).await;
        }
    };
    debug!(size = params.len(), "completion batch committed");
    let alone = params
        .iter()
        .zip(&answers)
        .filter(|(_, answer)| **answer == BatchCompletion::Alone)
        .map(|(p, _)| p);
    let mut alone = write_each(storage, lease_ttl, alone).await.into_iter();
    answers
        .into_iter()
        .map(|answer| match answer {
            BatchCompletion::Landed => Some(true),
            BatchCompletion::Lost => Some(false),
            // In the order given, one for each success left alone.
            BatchCompletion::Alone => alone.next().flatten(),
        })
        .collect()
}

/// Write each success by its own transaction, retried on transient errors. A success
/// of a batch whose commit failed after all is then found finished: reported as lost,
/// but nothing is written twice.
async fn write_each<'a>(
    storage: &'a dyn Storage,
    lease_ttl: Duration,
    params: impl Iterator<Item = &'a TaskCompleteParams>,
) -> Vec<Option<bool>> {
    futures::future::join_all(params.map(|p| {
        with_retries(lease_ttl, p.lease, move || {
            storage.task_complete_if_leased(p)
        })
    }))
    .await
}

async fn heartbeat_loop(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = sleep(shared.config.heartbeat_interval) => {}
        }
        crate::metrics::heartbeat();
        let leases: Vec<Lease> = shared.held().keys().copied().collect();
        if leases.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let renewed = shared
            .storage
            .lease_extend(&LeaseExtendParams {
                leases: leases.clone(),
                lease_ttl: shared.config.lease_ttl,
                now: None,
            })
            .await;
        match renewed {
            Ok(renewed) => {
                let deadline = shared.fence_after(sent);
                let cancels = cancel_requests(&shared, &renewed).await;
                let held = shared.held();
                for lease in leases {
                    let Some(entry) = held.get(&lease) else {
                        continue; // finished meanwhile
                    };
                    if renewed.contains(&lease) {
                        entry.deadline.send_replace(deadline);
                        if cancels.contains(&lease) {
                            entry.cancel_requested.cancel();
                        }
                    } else if entry.finishing.load(std::sync::atomic::Ordering::SeqCst)
                        || entry
                            .context
                            .as_ref()
                            .is_some_and(TaskContext::completion_committed)
                    {
                        debug!(task.id = %lease.id, "not renewed: its outcome was just written");
                    } else {
                        warn!(task.id = %lease.id, epoch = lease.epoch, "lease lost; stopping the handler");
                        entry.lost.cancel();
                    }
                }
            }
            // Deadlines stay where they are: if renewals keep failing, the executors
            // fence themselves before the leases expire.
            Err(e) => warn!(worker = %shared.id, error = %e, "heartbeat failed"),
        }
    }
}

/// The renewed leases whose task has a cancel request (none if the question fails: it
/// is asked again at the next heartbeat).
async fn cancel_requests(shared: &Shared, renewed: &[Lease]) -> Vec<Lease> {
    if renewed.is_empty() {
        return Vec::new();
    }
    let params = tenax_storage::CancelRequestedParams {
        leases: renewed.to_vec(),
    };
    match shared.storage.task_cancel_requested(&params).await {
        Ok(requested) => requested,
        Err(e) => {
            warn!(worker = %shared.id, error = %e, "reading cancel requests failed");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(attempt: u32, max_attempts: u32, kind: TaskKind) -> TaskRecord {
        let now = chrono::Utc::now();
        TaskRecord {
            id: TaskId(1),
            task_no: tenax_core::TaskNo::from_stored("T".into()),
            kind,
            parent_id: None,
            command_type: "X".into(),
            payload: "{}".into(),
            payload_version: 1,
            queue: "default".into(),
            priority: tenax_core::Priority::DEFAULT,
            status: tenax_core::TaskStatus::Running,
            attempt,
            max_attempts,
            lease_epoch: attempt.into(),
            lease_owner: Some("w".into()),
            lease_expires_at: Some(now),
            run_at: now,
            timeout_ms: 1000,
            last_error: None,
            result: None,
            compensation: None,
            created_at: now,
            updated_at: now,
            started_at: Some(now),
            finished_at: None,
            concurrency_key: None,
            concurrency_limit: 1,
        }
    }

    #[test]
    fn transient_failures_retry_until_the_budget_is_spent() {
        let policy = RetryPolicy::default().with_jitter(tenax_core::Jitter::None);
        let panicked = || Ended::Panicked("boom".into());
        assert_eq!(
            decide(
                &task(2, 3, TaskKind::Execute),
                panicked(),
                &policy,
                Ending::default()
            ),
            Decision::Fail(
                "handler panicked: boom".into(),
                FailNext::Retry(Duration::from_secs(10))
            )
        );
        assert_eq!(
            decide(
                &task(3, 3, TaskKind::Execute),
                panicked(),
                &policy,
                Ending::default()
            ),
            Decision::Fail(
                "handler panicked: boom (attempt 3 of 3: no attempts left)".into(),
                FailNext::Dead
            )
        );
        let later = Ended::Returned(Err(CommandError::retry_after(
            Duration::from_secs(7),
            "busy",
        )));
        assert!(matches!(
            decide(&task(1, 3, TaskKind::Execute), later, &policy, Ending::default()),
            Decision::Fail(_, FailNext::Retry(d)) if d == Duration::from_secs(7)
        ));
    }

    #[test]
    fn a_load_aware_policy_stretches_retries_with_the_backlog() {
        let policy =
            RetryPolicy::fixed(Duration::from_secs(10)).with_load(tenax_core::LoadAware::new(100));
        let t = task(1, 5, TaskKind::Execute);
        let after = |backlog| {
            let how = Ending {
                cancel_requested: false,
                backlog,
            };
            match decide(&t, Ended::Panicked("boom".into()), &policy, how) {
                Decision::Fail(_, FailNext::Retry(delay)) => delay,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(after(0), Duration::from_secs(20));
        assert_eq!(after(100), Duration::from_secs(40));
        assert_eq!(after(10_000), Duration::from_secs(100));
    }

    #[test]
    fn permanent_errors_shutdown_and_lost_leases() {
        let policy = RetryPolicy::default();
        let t = task(1, 5, TaskKind::Execute);
        let permanent = Ended::Returned(Err(CommandError::permanent("invalid id card")));
        assert_eq!(
            decide(&t, permanent, &policy, Ending::default()),
            Decision::Fail("invalid id card".into(), FailNext::Dead)
        );
        assert!(matches!(
            decide(&t, Ended::Stopped, &policy, Ending::default()),
            Decision::Fail(_, FailNext::HandBack)
        ));
        assert_eq!(
            decide(&t, Ended::Fenced("lease lost"), &policy, Ending::default()),
            Decision::Drop("lease lost")
        );
        let cancelled = Ending {
            cancel_requested: true,
            backlog: 0,
        };
        let retryable = || Ended::Returned(Err(CommandError::retryable("stopping")));
        assert_eq!(
            decide(&t, retryable(), &policy, cancelled),
            Decision::Fail("cancelled: stopping".into(), FailNext::Cancelled)
        );
        assert!(matches!(
            decide(
                &t,
                Ended::TimedOut(Duration::from_secs(1)),
                &policy,
                cancelled
            ),
            Decision::Fail(_, FailNext::Cancelled)
        ));
        assert!(matches!(
            decide(&t, Ended::Returned(Ok(None)), &policy, cancelled),
            Decision::Complete(None, CompensationState::Succeeded)
        ));
        assert!(matches!(
            decide(
                &t,
                Ended::Returned(Err(CommandError::permanent("no"))),
                &policy,
                cancelled
            ),
            Decision::Fail(_, FailNext::Dead)
        ));
        let none = Ended::Returned(Err(CommandError::NoCompensation));
        assert_eq!(
            decide(
                &task(1, 5, TaskKind::Compensate),
                none,
                &policy,
                Ending::default()
            ),
            Decision::Complete(None, CompensationState::None)
        );
    }
}
