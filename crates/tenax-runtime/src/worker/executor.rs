//! The executor: one per started attempt. It runs the handler in a task of its own
//! (a panic is a retryable failure), under the task's timeout, and stops it when its
//! lease is lost or can no longer be proven (self-fencing), when a cancel is
//! requested and the handler does not return, or at the worker's hard stop. When the
//! handler has returned, the executor gives its slot back (once its outcome has a
//! place among the bounded uncommitted ones), then writes the outcome and reports it
//! after the commit.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tenax_core::{DynHandler, ExecutionOutcome, TaskContext, TaskKind, TaskNo, TaskRecord};
use tenax_storage::{FailNext, Lease};
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use super::completer::write_outcome;
use super::outcome::{decide, panic_message, Decision, Ended, Ending};
use super::{Held, Shared};

/// A claimed task entered into the held map: from its claim on, the heartbeat renews
/// its lease, whether it waits in the claim loop's buffer, runs, or has its outcome
/// being written. Dropping it removes the entry: the lease is no longer renewed.
pub(super) struct Entry {
    pub(super) task: TaskRecord,
    pub(super) lease: Lease,
    /// The self-fencing deadline, moved forward by each renewal.
    pub(super) deadline: watch::Receiver<Instant>,
    /// Cancelled when the heartbeat learns the lease is lost.
    pub(super) lost: CancellationToken,
    /// Cancelled when the heartbeat learns that a cancel of the task was requested.
    pub(super) cancel_requested: CancellationToken,
    /// Set once the handler has stopped and its outcome is being written.
    pub(super) finishing: Arc<AtomicBool>,
    /// When the claim that took the task returned (for the start latency).
    pub(super) claimed: Instant,
    pub(super) held: HeldGuard,
}

impl Entry {
    /// Enter a claimed task, with the self-fencing deadline of its claim.
    pub(super) fn enter(shared: &Arc<Shared>, task: TaskRecord, deadline: Instant) -> Self {
        let lease = Lease {
            id: task.id,
            epoch: task.lease_epoch,
        };
        let (deadline_tx, deadline) = watch::channel(deadline);
        let lost = CancellationToken::new();
        let cancel_requested = CancellationToken::new();
        let finishing = Arc::new(AtomicBool::new(false));
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
        Self {
            task,
            lease,
            deadline,
            lost,
            cancel_requested,
            finishing,
            claimed: Instant::now(),
            held: HeldGuard {
                shared: shared.clone(),
                lease,
            },
        }
    }
}

/// Why an attempt may no longer start or write: its lease was lost, or its deadline
/// passed without a renewal.
pub(super) fn unprovable(
    lost: &CancellationToken,
    deadline: &watch::Receiver<Instant>,
) -> Option<&'static str> {
    if lost.is_cancelled() {
        Some("lease lost")
    } else if *deadline.borrow() <= Instant::now() {
        Some("lease could not be renewed in time (self-fenced)")
    } else {
        None
    }
}

/// One of the worker's `concurrency` slots, taken by a running handler. Dropping it
/// frees the slot and wakes the claim loop.
pub(super) struct Slot {
    /// Always `Some` until the drop, which returns it before it wakes the loop.
    pub(super) permit: Option<OwnedSemaphorePermit>,
    pub(super) shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        crate::metrics::slot_taken(false);
        // The permit first: a loop woken before it is back would find no free slot,
        // and the wake-up would be spent.
        drop(self.permit.take());
        self.shared.slot_freed.notify_one();
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

pub(super) fn idempotency_key(task: &TaskRecord) -> String {
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

pub(super) async fn execute(shared: &Arc<Shared>, entry: Entry, slot: Option<Slot>) {
    let task = &entry.task;
    let span = info_span!("task", task.id = %task.id, task.no = %task.task_no, command.r#type = %task.command_type,
                          task.kind = task.kind.as_str(), attempt = task.attempt, epoch = task.lease_epoch);
    run_attempt(shared, entry, slot).instrument(span).await;
}

async fn run_attempt(shared: &Arc<Shared>, entry: Entry, slot: Option<Slot>) {
    let _in_flight = InFlight::enter(&shared.in_flight);
    let Entry {
        task,
        lease,
        deadline: deadline_rx,
        lost,
        cancel_requested,
        finishing,
        claimed,
        held: _held,
    } = entry;
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
    if let Some(held) = shared.held().get_mut(&lease) {
        held.context = Some(ctx.clone());
    }
    let Some(handler) = shared.registry.get(&task.command_type) else {
        // Cannot happen: only registered types are claimed.
        let error = "no handler registered for this command type".to_owned();
        finish(
            shared,
            &task,
            lease,
            slot,
            Decision::Fail(error, FailNext::Dead),
        )
        .await;
        return;
    };
    // A buffered task whose lease went unrenewed, or was lost, never starts.
    let not_started = match older_attempts_done(shared, lease, &lost, &deadline_rx).await {
        Some(why) => Some(why),
        None => unprovable(&lost, &deadline_rx),
    };
    if let Some(why) = not_started {
        let how = Ending {
            cancel_requested: false,
            backlog: 0,
        };
        let decision = decide(&task, Ended::Fenced(why), &handler.retry_policy(), how);
        finish(shared, &task, lease, slot, decision).await;
        return;
    }
    for hook in &shared.hooks {
        hook.before(&ctx).await;
    }
    debug!(
        since_claim_us = claimed.elapsed().as_micros() as u64,
        "attempt started"
    );
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
    finishing.store(true, Ordering::SeqCst);
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
    finish(shared, &task, lease, slot, decision).await;
}

/// Give the slot back, then write the decision and report it after its commit. The
/// slot is freed once the outcome has a place among the worker's uncommitted outcomes
/// (at most `complete_batch`): while they are all taken, the slot stays held, and the
/// claim loop, which claims only for free slots and its buffer, waits.
async fn finish(
    shared: &Arc<Shared>,
    task: &TaskRecord,
    lease: Lease,
    slot: Option<Slot>,
    decision: Decision,
) {
    // The semaphore is never closed; a failed acquire leaves the slot held until the
    // write below is done, as before slots were freed early.
    let place = shared.outcomes.clone().acquire_owned().await.ok();
    drop(slot);
    let decision = decision.masked(&shared.config.secrets, task);
    let outcome = write_outcome(shared, lease, decision).await;
    drop(place);
    crate::metrics::attempt_ended(task, outcome);
}

/// Wait until no older attempt of this task runs in this process. A process paused
/// past its lease (a stopped VM, a SIGSTOP) wakes up with its lease lost: its fenced
/// attempt is told to stop, and meanwhile its claim loop may take the same task again
/// under the next epoch. The new attempt starts only once the old one has returned,
/// so one process never runs a task twice at once. `None` once no older attempt is
/// left; `Some(why)` if this attempt's own lease was lost or went unrenewed meanwhile.
pub(super) async fn older_attempts_done(
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
        if let Some(why) = unprovable(lost, deadline) {
            return Some(why);
        }
        sleep(Duration::from_millis(5)).await;
    }
}

/// Counts an attempt in [`Shared::in_flight`] until it is dropped.
pub(super) struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    pub(super) fn enter(count: &Arc<AtomicUsize>) -> Self {
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
pub(super) struct HeldGuard {
    pub(super) shared: Arc<Shared>,
    pub(super) lease: Lease,
}

impl Drop for HeldGuard {
    fn drop(&mut self) {
        self.shared.held().remove(&self.lease);
    }
}

/// The signals an attempt is supervised with.
pub(super) struct Tokens<'a> {
    /// Cancelled when the lease is lost.
    pub(super) lost: &'a CancellationToken,
    /// Cancelled when a cancel of the task was requested.
    pub(super) cancel_requested: &'a CancellationToken,
    /// The handler's own token ([`TaskContext::cancellation`]).
    pub(super) cancellation: &'a CancellationToken,
}

/// Run the handler until it returns, panics, times out, loses its lease or is stopped.
/// The handler task is aborted and awaited before this returns, so nothing of it runs
/// after its outcome is decided.
pub(super) async fn supervise(
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

/// Resolves when the deadline in `rx` has passed without being moved forward.
pub(super) async fn fence_deadline(mut rx: watch::Receiver<Instant>) {
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
