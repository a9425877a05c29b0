//! Batch commands ([`tenax_core::BatchCommand`]): one loop per batch type claims up to
//! a batch of its due tasks in one statement, runs them in one handler call, and writes
//! each task's outcome under its own lease.
//!
//! - **Filling**: before claiming, the loop counts the type's due tasks
//!   ([`Storage::task_due_count`]). It claims at once when a full batch is due, or when
//!   the oldest due task has waited `MAX_WAIT`; otherwise it waits (holding no lease)
//!   until then, a wake-up or the poll interval, and counts again.
//! - **Keys**: the claimed tasks are split by batch key; each key's share runs as a
//!   batch of its own, so a batch never mixes keys and never exceeds `MAX_BATCH`.
//!   Compensations, and tasks whose payload does not decode, run one by one as single
//!   tasks do.
//! - **Leases**: every task of a batch is in the `held` map, so the heartbeat renews
//!   them all in its one statement. The handler call is stopped as soon as any of
//!   them is lost or can no longer be proven (self-fencing), as a single task's
//!   handler is: a lost task's outcome is dropped, and the tasks whose lease still
//!   holds are handed back (retried at once, the attempt refunded). A cancel request
//!   for one task signals that task's [`TaskContext::cancellation`] only.
//! - **Outcomes**: each task's outcome is decided as a single task's would be (its own
//!   attempt budget, backoff and death). The successes of a batch are written in one
//!   statement ([`Storage::task_complete_many_if_leased`]); each failure is written by
//!   its own fenced write ([`Storage::task_fail_if_leased`]), all at once.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join, join_all, select_all};
use futures::FutureExt;
use rand::Rng;
use tenax_core::{
    CommandError, DynBatchHandler, ExecutionOutcome, RawItem, TaskContext, TaskKind, TaskRecord,
};
use tenax_storage::{
    FailNext, Lease, StorageError, TaskClaimParams, TaskCompleteParams, TaskDueCountParams,
};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::completer::{report_write, write_batch, write_outcome};
use super::executor::{
    execute, fence_deadline, idempotency_key, older_attempts_done, unprovable, Entry, HeldGuard,
};
use super::outcome::{decide, panic_message, Decision, Ended, Ending};
use super::Shared;
use crate::config::WorkerConfig;
use crate::timer::next_due_wait;

/// Claim and run batches of one batch type until `shutdown`, then wait for the
/// batches still running (stopped by the worker's hard stop after the grace).
pub(super) async fn batch_loop(
    shared: Arc<Shared>,
    handler: Arc<dyn DynBatchHandler>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(handler.concurrency().max(1) as usize));
    let mut running = JoinSet::new();
    let mut wakeups = shared.storage.wakeups();
    let commands = vec![(handler.command_type().to_owned(), handler.version())];
    let mut failures = 0u32;
    loop {
        while let Some(joined) = running.try_join_next() {
            if let Err(e) = joined {
                error!("batch executor failed: {e}");
            }
        }
        let mut permit: Option<OwnedSemaphorePermit> = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => Some(permit),
                Err(_) => break,
            },
            _ = shutdown.cancelled() => break,
        };
        let queues = shared
            .gate
            .queues(shared.storage.as_ref(), &shared.config)
            .await;
        let sent = Instant::now();
        let wait = match fill_wait(&shared, handler.as_ref(), &queues, &commands, sent).await {
            Ok(Some(wait)) => {
                failures = 0;
                Some(wait)
            }
            Ok(None) => match claim(&shared, handler.as_ref(), &queues).await {
                Ok(tasks) if tasks.is_empty() => {
                    failures = 0;
                    Some(shared.config.poll_interval)
                }
                Ok(tasks) => {
                    failures = 0;
                    let deadline = shared.fence_after(sent);
                    let shared = shared.clone();
                    let handler = handler.clone();
                    let permit = permit.take();
                    running.spawn(async move {
                        run_claimed(&shared, handler, tasks, deadline).await;
                        drop(permit);
                    });
                    None
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    warn!(worker = %shared.id, error = %e, "batch claim failed");
                    Some(backoff(&shared.config, failures))
                }
            },
            Err(e) => {
                failures = failures.saturating_add(1);
                warn!(worker = %shared.id, error = %e, "counting due tasks failed");
                Some(backoff(&shared.config, failures))
            }
        };
        drop(permit);
        if let Some(wait) = wait {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = sleep(wait) => {}
                _ = wakeups.changed(), if failures == 0 => {}
            }
        }
    }
    while let Some(joined) = running.join_next().await {
        if let Err(e) = joined {
            error!("batch executor failed: {e}");
        }
    }
}

/// Back off from a failing database, with jitter so workers do not return together.
fn backoff(config: &WorkerConfig, failures: u32) -> Duration {
    let ceiling = config.poll_interval.saturating_mul(1 << failures.min(5));
    rand::rng().random_range(config.poll_interval..=ceiling)
}

/// `None` to claim now (a full batch is due, or the oldest due task has waited the
/// maximum), else how long to wait before counting again.
async fn fill_wait(
    shared: &Shared,
    handler: &dyn DynBatchHandler,
    queues: &[String],
    commands: &[(String, u32)],
    counted: Instant,
) -> Result<Option<Duration>, StorageError> {
    let max = handler.max_batch();
    let due = shared
        .storage
        .task_due_count(&TaskDueCountParams {
            queues: queues.to_vec(),
            command_type: handler.command_type().to_owned(),
            version: handler.version(),
            limit: max,
            now: None,
        })
        .await?;
    if due.due >= max {
        return Ok(None);
    }
    let Some(oldest) = due.oldest_due_at else {
        // Nothing due: wait for the next delayed task, a wake-up or the poll.
        let wait = next_due_wait(
            shared.storage.as_ref(),
            &shared.config,
            queues,
            commands,
            counted,
        )
        .await;
        return Ok(Some(wait));
    };
    let waited = (due.now - oldest).to_std().unwrap_or(Duration::ZERO);
    let max_wait = handler.max_wait();
    if waited >= max_wait {
        return Ok(None);
    }
    Ok(Some((max_wait - waited).min(shared.config.poll_interval)))
}

/// Claim up to a batch of due tasks of the type, in one statement.
async fn claim(
    shared: &Shared,
    handler: &dyn DynBatchHandler,
    queues: &[String],
) -> Result<Vec<TaskRecord>, StorageError> {
    let tasks = shared
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: shared.id.clone(),
            queues: queues.to_vec(),
            commands: vec![(handler.command_type().to_owned(), handler.version())],
            limit: handler.max_batch(),
            lease_ttl: shared.config.lease_ttl,
            now: None,
        })
        .await?;
    crate::metrics::claimed(&tasks, shared.config.lease_ttl);
    Ok(tasks)
}

/// Run claimed tasks of a batch type: one batch per batch key, and compensations and
/// undecodable payloads one by one.
pub(super) async fn run_claimed(
    shared: &Arc<Shared>,
    handler: Arc<dyn DynBatchHandler>,
    tasks: Vec<TaskRecord>,
    deadline: Instant,
) {
    let mut singles = Vec::new();
    let mut groups: Vec<(Option<String>, Vec<TaskRecord>)> = Vec::new();
    for task in tasks {
        if task.kind != TaskKind::Execute {
            singles.push(task);
            continue;
        }
        match handler.batch_key(&task.payload, task.payload_version) {
            Ok(key) => match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, group)) => group.push(task),
                None => groups.push((key, vec![task])),
            },
            // Run alone, its decode error kills it as it would a single task.
            Err(_) => singles.push(task),
        }
    }
    let singles = join_all(
        singles
            .into_iter()
            .map(|task| execute(shared, Entry::enter(shared, task, deadline), None)),
    );
    let batches = join_all(groups.into_iter().map(|(key, tasks)| {
        let span = info_span!("batch", command.r#type = %handler.command_type(),
                              batch.key = key.as_deref().unwrap_or(""), batch.size = tasks.len());
        run_batch(shared, handler.clone(), tasks, deadline).instrument(span)
    }));
    join(singles, batches).await;
}

/// One task of a running batch.
struct Member {
    task: TaskRecord,
    lease: Lease,
    ctx: TaskContext,
    lost: CancellationToken,
    cancel_requested: CancellationToken,
    cancellation: CancellationToken,
    deadline: watch::Receiver<Instant>,
    finishing: Arc<AtomicBool>,
    _held: HeldGuard,
}

impl Member {
    /// Whether this task's lease is lost or can no longer be proven.
    fn fenced(&self) -> Option<&'static str> {
        unprovable(&self.lost, &self.deadline)
    }
}

/// How a batch's handler call ended.
enum BatchEnded {
    Returned(Vec<Result<String, CommandError>>),
    Panicked(String),
    TimedOut(Duration),
    /// A lease of the batch was lost or could not be proven in time.
    Fenced,
    Stopped,
}

async fn run_batch(
    shared: &Arc<Shared>,
    handler: Arc<dyn DynBatchHandler>,
    tasks: Vec<TaskRecord>,
    deadline: Instant,
) {
    let mut members = Vec::with_capacity(tasks.len());
    for task in tasks {
        members.push(enter(shared, task, deadline));
    }
    // A task whose older attempt still stops here waits for it, as a single task does;
    // one whose lease is lost meanwhile leaves the batch with its outcome dropped.
    let mut ready = Vec::with_capacity(members.len());
    for member in members {
        match older_attempts_done(shared, member.lease, &member.lost, &member.deadline).await {
            None => ready.push(member),
            Some(why) => {
                let outcome = write_outcome(shared, member.lease, Decision::Drop(why)).await;
                crate::metrics::attempt_ended(&member.task, outcome);
            }
        }
    }
    let members = ready;
    if members.is_empty() {
        return;
    }
    for member in &members {
        for hook in &shared.hooks {
            hook.before(&member.ctx).await;
        }
    }
    debug!(size = members.len(), "batch started");
    let started = std::time::Instant::now();
    let ended = supervise_batch(shared, handler.clone(), &members).await;
    let took = started.elapsed();
    for member in &members {
        crate::metrics::executed(&member.task, took);
        member.finishing.store(true, Ordering::SeqCst);
    }
    let policy = handler.retry_policy();
    let backlog = match (policy.load.is_some(), members.first()) {
        (true, Some(first)) => {
            shared
                .backlog
                .due(shared.storage.as_ref(), &first.task.queue)
                .await
        }
        _ => 0,
    };
    let (ended, mut outcomes) = match ended {
        BatchEnded::Returned(outcomes) => (BatchEnded::Returned(Vec::new()), outcomes.into_iter()),
        other => (other, Vec::new().into_iter()),
    };
    let mut decisions = Vec::with_capacity(members.len());
    for member in &members {
        let ended_here = match &ended {
            BatchEnded::Returned(_) => {
                let outcome = outcomes.next().unwrap_or_else(|| {
                    Err(CommandError::retryable(
                        "the batch handler returned no outcome for this task",
                    ))
                });
                match member.fenced() {
                    Some(why) => Ended::Fenced(why),
                    None => Ended::Returned(outcome.map(Some)),
                }
            }
            BatchEnded::Panicked(message) => Ended::Panicked(message.clone()),
            BatchEnded::TimedOut(after) => Ended::TimedOut(*after),
            BatchEnded::Stopped => Ended::Stopped,
            BatchEnded::Fenced => match member.fenced() {
                Some(why) => Ended::Fenced(why),
                None => {
                    for hook in &shared.hooks {
                        hook.after(&member.ctx, ExecutionOutcome::Failed).await;
                    }
                    decisions.push(Decision::Fail(
                        "batch stopped: the lease of another task of its batch was lost".into(),
                        FailNext::HandBack,
                    ));
                    continue;
                }
            },
        };
        let observed = match &ended_here {
            Ended::Returned(Ok(_)) => ExecutionOutcome::Succeeded,
            Ended::Fenced(_) => ExecutionOutcome::Fenced,
            _ => ExecutionOutcome::Failed,
        };
        for hook in &shared.hooks {
            hook.after(&member.ctx, observed).await;
        }
        let how = Ending {
            cancel_requested: member.cancel_requested.is_cancelled(),
            backlog,
        };
        decisions.push(decide(&member.task, ended_here, &policy, how));
    }
    write_decisions(shared, &members, decisions).await;
}

/// Enter a claimed task into the held map, so the heartbeat renews its lease.
fn enter(shared: &Arc<Shared>, task: TaskRecord, deadline: Instant) -> Member {
    // A batch item never commits its own completion (no transactional batch commands),
    // so its held entry never needs a context.
    let Entry {
        task,
        lease,
        deadline,
        lost,
        cancel_requested,
        finishing,
        claimed: _,
        held,
    } = Entry::enter(shared, task, deadline);
    let cancellation = CancellationToken::new();
    let ctx = TaskContext::new(
        task.id,
        task.task_no.clone(),
        task.kind,
        task.attempt,
        task.max_attempts,
        task.lease_epoch,
        idempotency_key(&task),
        None,
        cancellation.clone(),
    )
    .with_concurrency_key(task.concurrency_key.clone())
    .with_parents(Arc::new(crate::workflow::StorageParents(
        shared.storage.clone(),
    )));
    Member {
        task,
        lease,
        ctx,
        lost,
        cancel_requested,
        cancellation,
        deadline,
        finishing,
        _held: held,
    }
}

/// Run the batch's handler call until it returns, panics, times out (the shortest
/// timeout of its tasks), loses a lease or is stopped. The call is aborted and awaited
/// before this returns.
async fn supervise_batch(
    shared: &Arc<Shared>,
    handler: Arc<dyn DynBatchHandler>,
    members: &[Member],
) -> BatchEnded {
    let items = members
        .iter()
        .map(|m| RawItem {
            payload: m.task.payload.clone(),
            version: m.task.payload_version,
            task: m.ctx.clone(),
        })
        .collect();
    let future = handler
        .execute_batch(items)
        .instrument(tracing::Span::current());
    let mut handle = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(future));
    let _cancel_on_drop: Vec<_> = members
        .iter()
        .map(|m| m.cancellation.clone().drop_guard())
        .collect();
    // A cancel request reaches only its own task's token.
    let _forwarders: Vec<_> = members
        .iter()
        .map(|m| {
            let requested = m.cancel_requested.clone();
            let cancellation = m.cancellation.clone();
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
                tokio::select! {
                    _ = requested.cancelled() => {
                        info!("cancel requested for a task of the batch; signalling it");
                        cancellation.cancel();
                    }
                    _ = cancellation.cancelled() => {}
                }
            }))
        })
        .collect();
    let timeout = members
        .iter()
        .map(|m| Duration::from_millis(m.task.timeout_ms.max(1)))
        .min()
        .unwrap_or(Duration::from_millis(1));
    let timed_out = sleep(timeout);
    tokio::pin!(timed_out);
    let any_lost = select_all(
        members
            .iter()
            .map(|m| m.lost.clone().cancelled_owned().boxed()),
    );
    let any_fenced = select_all(
        members
            .iter()
            .map(|m| fence_deadline(m.deadline.clone()).boxed()),
    );
    let ended = tokio::select! {
        joined = &mut handle => {
            return match joined {
                Ok(outcomes) => BatchEnded::Returned(outcomes),
                Err(e) if e.is_panic() => BatchEnded::Panicked(panic_message(&*e.into_panic())),
                Err(e) => BatchEnded::Panicked(format!("handler task failed: {e}")),
            };
        }
        _ = &mut timed_out => BatchEnded::TimedOut(timeout),
        _ = any_fenced => BatchEnded::Fenced,
        _ = any_lost => BatchEnded::Fenced,
        _ = shared.hard_stop.cancelled() => BatchEnded::Stopped,
    };
    for member in members {
        member.cancellation.cancel();
    }
    let window = (shared.config.fence_margin / 2).min(Duration::from_secs(1));
    if tokio::time::timeout(window, &mut handle).await.is_err() {
        handle.abort();
        let _ = handle.await;
    }
    ended
}

/// Write the batch's decisions: its successes in one statement, each failure by its
/// own fenced write, all at once.
async fn write_decisions(shared: &Arc<Shared>, members: &[Member], decisions: Vec<Decision>) {
    use crate::metrics::Outcome;
    let mut completes = Vec::new();
    let mut completed = Vec::new();
    let mut others = Vec::new();
    for (member, decision) in members.iter().zip(decisions) {
        match decision.masked(&shared.config.secrets, &member.task) {
            Decision::Complete(result, compensation) => {
                completes.push(TaskCompleteParams {
                    lease: member.lease,
                    result,
                    compensation,
                    now: None,
                });
                completed.push(member);
            }
            other => others.push((member, other)),
        }
    }
    let successes = async {
        if completes.is_empty() {
            return;
        }
        let written =
            write_batch(shared.storage.as_ref(), shared.config.lease_ttl, &completes).await;
        for (member, written) in completed.iter().zip(written) {
            report_write(written, "succeeded");
            let outcome = match written {
                Some(true) => Outcome::Succeeded {
                    compensation_none: false,
                },
                Some(false) => Outcome::Dropped,
                None => Outcome::Unwritten,
            };
            crate::metrics::attempt_ended(&member.task, outcome);
        }
    };
    let failures = join_all(others.into_iter().map(|(member, decision)| async move {
        let outcome = write_outcome(shared, member.lease, decision).await;
        crate::metrics::attempt_ended(&member.task, outcome);
    }));
    join(successes, failures).await;
}
