//! The claim loop and its buffer.
//!
//! The loop keeps up to `concurrency` handlers running and, beyond them, a bounded
//! buffer of claimed tasks ready to start. A freed slot starts the next buffered task
//! at once, without a round trip. The buffer is refilled by one claim statement when
//! it falls to half its size: the claim asks for the free slots plus the room left in
//! the buffer, so what the worker holds never exceeds `concurrency` running plus the
//! buffer. One claim is in flight at a time, and the loop keeps starting buffered tasks
//! while it runs.
//!
//! The buffer's size follows the handlers' pace ([`BufferSize`]) unless
//! `WorkerConfig::prefetch` sets it. It starts at `concurrency` (at most
//! `claim_batch`). A claim is sent when the buffer is down to half, so handlers longer
//! than about two claim round trips never empty it while the claim is in flight, and it
//! stays there: one round of handlers. When shorter handlers do empty it before a full
//! claim returns, it doubles, up to [`WorkerConfig::prefetch_size`] (`claim_batch`);
//! when they no longer do, it shrinks, by half at most per claim, to twice what they
//! started during the last claim; and a claim that comes back short (nothing more was
//! due) sets it back to `concurrency`. So under a backlog of short tasks one claim
//! carries what the handlers run in about a round trip, and a task enqueued behind the
//! full buffer waits about two claims' time. The worst case is a backlog whose
//! handlers turn slow while the buffer is large: the tasks already buffered start
//! first, at most `prefetch_size() / concurrency` rounds of handlers, while the buffer
//! halves at each claim back to one round.
//!
//! Buffered tasks are claimed tasks: they are `running` in the database under this
//! worker's lease, renewed by the heartbeat like running ones. So every cluster-wide
//! limit (queue limits, rate limits, concurrency keys) counts them as running. A
//! graceful stop hands them back at once (retry now, attempt refunded); a kill loses
//! nothing, they return when their leases expire.
//!
//! When a claim comes back short (nothing more was due), the loop asks the database
//! when the next task it could claim falls due and sleeps until then, at most the poll
//! interval; a wake-up ends the sleep at once, and a wake-up that arrives while a claim
//! is in flight makes the loop claim again as soon as that claim returns.
//!
//! [`WorkerConfig::prefetch_size`]: crate::WorkerConfig::prefetch_size
//! [`BufferSize`]: self::BufferSize
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use rand::Rng;
use tenax_core::TaskRecord;
use tenax_storage::{FailNext, StorageError, TaskClaimParams};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::completer::write_outcome;
use super::executor::{execute, Entry, Slot};
use super::outcome::Decision;
use super::Shared;
use crate::timer::next_due_wait;

/// One claim statement and what it returned.
struct Round {
    /// When it was sent: the claimed leases' self-fencing deadlines count from here.
    sent: Instant,
    limit: u32,
    claimed: Result<Vec<TaskRecord>, StorageError>,
    /// The queues it claimed from (the background gate's choice).
    queues: Vec<String>,
}

/// What woke the loop.
enum Event {
    Stop,
    Claimed(Round),
    /// The timer armed after a short claim: sleep this long (generation, wait).
    Armed(u64, Duration),
    SlotFreed,
    Woken {
        open: bool,
    },
    Timer,
}

type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

async fn claim_round(shared: Arc<Shared>, commands: Arc<Vec<(String, u32)>>, limit: u32) -> Round {
    let sent = Instant::now();
    let queues = shared
        .gate
        .queues(shared.storage.as_ref(), &shared.config)
        .await;
    let claimed = shared
        .storage
        .task_claim_batch(&TaskClaimParams {
            worker: shared.id.clone(),
            queues: queues.clone(),
            commands: commands.to_vec(),
            limit,
            lease_ttl: shared.config.lease_ttl,
            now: None,
        })
        .await;
    Round {
        sent,
        limit,
        claimed,
        queues,
    }
}

/// Resolves with `pending`'s output, or never when there is none.
async fn maybe<T>(pending: &mut Option<Pending<T>>) -> T {
    match pending.as_mut() {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Claim and start tasks until `shutdown`; then hand the buffer back.
pub(super) async fn claim_loop(
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
    executors: &mut JoinSet<()>,
) {
    // Each type with the payload version it decodes: tasks of newer versions wait for a
    // worker that knows them.
    let commands = Arc::new(shared.registry.single_commands());
    if commands.is_empty() {
        // Only batch commands: their own loops claim.
        shutdown.cancelled().await;
        return;
    }
    let config = &shared.config;
    let slots = Arc::new(Semaphore::new(config.concurrency as usize));
    let mut size = BufferSize::new(config);
    let mut buffer: VecDeque<Entry> = VecDeque::new();
    // While a claim is in flight: how many buffered tasks started, and whether a slot
    // freed by a handler found the buffer empty (it was too small for the handlers).
    // Slots already free when the claim was sent (an idle worker) prove nothing.
    let mut started_while_claiming = 0u32;
    let mut free_at_send = 0u32;
    let mut starved = false;
    let mut wakeups = shared.storage.wakeups();
    let mut wakeups_open = true;
    let mut claiming: Option<Pending<Round>> = None;
    let mut arming: Option<Pending<(u64, Duration)>> = None;
    let mut generation = 0u64;
    // No claim before this instant, unless a wake-up comes (after a short or failed claim).
    let mut idle_until: Option<Instant> = None;
    // Without a buffer: while tasks run, a claim waits this long at most for more slots.
    let mut linger_until: Option<Instant> = None;
    let mut woken_while_claiming = false;
    let mut failures = 0u32;
    loop {
        while let Some(joined) = executors.try_join_next() {
            if let Err(e) = joined {
                error!("executor failed: {e}");
            }
        }
        let started = start_buffered(shared, &slots, &mut buffer, executors);
        if claiming.is_some() {
            started_while_claiming += started;
            let free = slots.available_permits() as u32;
            starved |= buffer.is_empty()
                && free > 0
                && (started_while_claiming > 0 || free > free_at_send);
        }
        let now = Instant::now();
        if claiming.is_none() && idle_until.is_none_or(|until| until <= now) {
            idle_until = None;
            let free = slots.available_permits() as u32;
            let held = buffer.len() as u32;
            let room = (free + size.get())
                .saturating_sub(held)
                .min(config.claim_batch);
            if held <= size.low_water()
                && room > 0
                && !lingers(config, free, now, &mut linger_until)
            {
                linger_until = None;
                woken_while_claiming = false;
                started_while_claiming = 0;
                free_at_send = free;
                starved = false;
                arming = None;
                generation += 1;
                claiming = Some(Box::pin(claim_round(
                    shared.clone(),
                    commands.clone(),
                    room,
                )));
            }
        }
        let timer = match (&claiming, idle_until, linger_until) {
            (Some(_), _, _) => None,
            (None, Some(until), _) => Some(until),
            (None, None, linger) => linger,
        };
        let event = tokio::select! {
            biased;
            _ = shutdown.cancelled() => Event::Stop,
            round = maybe(&mut claiming) => Event::Claimed(round),
            _ = shared.slot_freed.notified() => Event::SlotFreed,
            changed = wakeups.changed(), if wakeups_open && failures == 0 => {
                Event::Woken { open: changed.is_ok() }
            }
            armed = maybe(&mut arming) => Event::Armed(armed.0, armed.1),
            _ = sleep_until(timer.unwrap_or(now)), if timer.is_some() => Event::Timer,
        };
        match event {
            Event::Stop => break,
            Event::Claimed(round) => {
                claiming = None;
                let short =
                    round_claimed(shared, round, &mut buffer, &mut failures, &slots, executors);
                if !matches!(short, Claimed::Full) {
                    // Nothing more was due (or the claim failed): the handlers' pace is
                    // unknown again, and the next burst starts from one round of them.
                    size.reset();
                }
                match short {
                    Claimed::Full => {
                        size.after_full_claim(started_while_claiming, starved);
                        debug!(
                            started = started_while_claiming,
                            starved,
                            size = size.get(),
                            "buffer sized"
                        );
                    }
                    Claimed::Failed => {
                        // Back off from a failing database, with jitter so workers do
                        // not return together.
                        let poll = config.poll_interval;
                        let ceiling = poll.saturating_mul(1 << failures.min(5));
                        let wait = rand::rng().random_range(poll..=ceiling);
                        idle_until = Some(Instant::now() + wait);
                    }
                    Claimed::Short { sent, queues } if !woken_while_claiming => {
                        // Nothing more is due: sleep until the next task falls due (the
                        // timer, armed beside the loop so buffered tasks keep starting),
                        // at most the poll interval, or a wake-up.
                        idle_until = Some(Instant::now() + config.poll_interval);
                        let shared = shared.clone();
                        let commands = commands.clone();
                        let armed = generation;
                        arming = Some(Box::pin(async move {
                            let wait = next_due_wait(
                                shared.storage.as_ref(),
                                &shared.config,
                                &queues,
                                &commands,
                                sent,
                            )
                            .await;
                            (armed, wait)
                        }));
                    }
                    Claimed::Short { .. } => {} // woken meanwhile: claim again now
                }
            }
            Event::Armed(armed, wait) => {
                arming = None;
                if armed == generation && claiming.is_none() && idle_until.is_some() {
                    idle_until = Some(Instant::now() + wait);
                }
            }
            Event::Woken { open } => {
                wakeups_open = open;
                debug!("woken");
                if claiming.is_some() {
                    woken_while_claiming = true;
                } else {
                    idle_until = None;
                    arming = None;
                }
            }
            Event::SlotFreed | Event::Timer => {}
        }
    }
    // Stopping: what an unfinished claim took joins the buffer, and the buffer is
    // handed back at once, so other workers can claim it without waiting for leases.
    if let Some(round) = claiming.take() {
        let round = round.await;
        if let Ok(tasks) = round.claimed {
            crate::metrics::claimed(&tasks, config.lease_ttl);
            let deadline = shared.fence_after(round.sent);
            buffer.extend(tasks.into_iter().map(|t| Entry::enter(shared, t, deadline)));
        }
    }
    hand_back(shared, buffer).await;
}

/// Without a buffer, while tasks run and fewer than half the slots (or a claim batch)
/// are free, a claim waits up to `batch_linger` for more: with batched completions
/// slots free in groups, and this keeps a claim from taking one task per freed slot.
/// An idle worker, or one with a buffer, claims at once.
fn lingers(
    config: &crate::WorkerConfig,
    free: u32,
    now: Instant,
    linger_until: &mut Option<Instant>,
) -> bool {
    if config.prefetch_size() > 0 || config.batch_linger.is_zero() {
        return false;
    }
    let want = config.claim_batch.min(config.concurrency.div_ceil(2));
    let running = config.concurrency - free;
    if running == 0 || free >= want {
        return false;
    }
    let until = *linger_until.get_or_insert(now + config.batch_linger);
    now < until
}

enum Claimed {
    /// As many as asked for: more may be due right now.
    Full,
    /// Fewer: nothing more was due when the claim ran.
    Short {
        sent: Instant,
        queues: Vec<String>,
    },
    Failed,
}

/// Enter what a claim returned, start what the free slots take, and buffer the rest.
fn round_claimed(
    shared: &Arc<Shared>,
    round: Round,
    buffer: &mut VecDeque<Entry>,
    failures: &mut u32,
    slots: &Arc<Semaphore>,
    executors: &mut JoinSet<()>,
) -> Claimed {
    let tasks = match round.claimed {
        Ok(tasks) => tasks,
        Err(e) => {
            *failures = failures.saturating_add(1);
            warn!(worker = %shared.id, error = %e, "claim failed");
            return Claimed::Failed;
        }
    };
    *failures = 0;
    debug!(
        claimed = tasks.len(),
        limit = round.limit,
        took_us = round.sent.elapsed().as_micros() as u64,
        ids = ?tasks.iter().map(|t| t.id.0).collect::<Vec<_>>(),
        "claim returned"
    );
    crate::metrics::claimed(&tasks, shared.config.lease_ttl);
    let full = tasks.len() as u32 >= round.limit;
    let deadline = shared.fence_after(round.sent);
    buffer.extend(tasks.into_iter().map(|t| Entry::enter(shared, t, deadline)));
    start_buffered(shared, slots, buffer, executors);
    if full {
        Claimed::Full
    } else {
        Claimed::Short {
            sent: round.sent,
            queues: round.queues,
        }
    }
}

/// Start buffered tasks, oldest claim first, while slots are free; returns how many
/// started.
fn start_buffered(
    shared: &Arc<Shared>,
    slots: &Arc<Semaphore>,
    buffer: &mut VecDeque<Entry>,
    executors: &mut JoinSet<()>,
) -> u32 {
    let mut started = 0;
    while !buffer.is_empty() {
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            break;
        };
        let Some(entry) = buffer.pop_front() else {
            break;
        };
        started += 1;
        crate::metrics::slot_taken(true);
        let slot = Slot {
            permit: Some(permit),
            shared: shared.clone(),
        };
        let shared = shared.clone();
        executors.spawn(async move { execute(&shared, entry, Some(slot)).await });
    }
    started
}

/// How many claimed tasks the buffer holds when full (see the module docs).
#[derive(Debug)]
struct BufferSize {
    size: u32,
    floor: u32,
    ceiling: u32,
    /// `WorkerConfig::prefetch` unset: the size follows the handlers' pace.
    adaptive: bool,
}

impl BufferSize {
    fn new(config: &crate::WorkerConfig) -> Self {
        let floor = config.prefetch_floor();
        Self {
            size: floor,
            floor,
            ceiling: config.prefetch_size().max(floor),
            adaptive: config.prefetch.is_none(),
        }
    }

    fn get(&self) -> u32 {
        self.size
    }

    /// The buffer is refilled once it holds this many or fewer.
    fn low_water(&self) -> u32 {
        self.size / 2
    }

    /// Back to the floor (one round of handlers), after a claim that came back short.
    fn reset(&mut self) {
        if self.adaptive {
            self.size = self.floor;
        }
    }

    /// A claim came back full (more may be due). While it was in flight the handlers
    /// started `started` buffered tasks, and `starved` says whether they emptied the
    /// buffer with a slot free: then the buffer doubles. Otherwise it shrinks to twice
    /// what they started, by half at most per claim.
    fn after_full_claim(&mut self, started: u32, starved: bool) {
        if !self.adaptive {
            return;
        }
        let next = if starved {
            self.size.saturating_mul(2).max(1)
        } else {
            started.saturating_mul(2).max(self.size / 2)
        };
        self.size = next.clamp(self.floor, self.ceiling);
    }
}

/// Hand back buffered tasks at a graceful stop: each is retried at once by whichever
/// worker claims it next, with the attempt it was claimed under refunded.
async fn hand_back(shared: &Arc<Shared>, buffer: VecDeque<Entry>) {
    if buffer.is_empty() {
        return;
    }
    info!(worker = %shared.id, tasks = buffer.len(), "handing back the buffered tasks");
    join_all(buffer.into_iter().map(|entry| async move {
        let decision = Decision::Fail(
            "worker stopped before the attempt started".into(),
            FailNext::HandBack,
        );
        let outcome = write_outcome(shared, entry.lease, decision).await;
        crate::metrics::attempt_ended(&entry.task, outcome);
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use super::BufferSize;
    use crate::WorkerConfig;

    #[test]
    fn the_buffer_doubles_while_handlers_empty_it_and_shrinks_back_when_they_slow() {
        let mut size = BufferSize::new(&WorkerConfig::default());
        assert_eq!((size.get(), size.low_water()), (10, 5));
        for expected in [20, 40, 80, 100, 100] {
            size.after_full_claim(30, true);
            assert_eq!(size.get(), expected);
        }
        // Handlers that start 30 tasks per claim without emptying it: 60 is enough.
        size.after_full_claim(30, false);
        assert_eq!(size.get(), 60);
        // Slow handlers: back to one round of them, at most half per claim.
        size.after_full_claim(0, false);
        assert_eq!(size.get(), 30);
        size.after_full_claim(0, false);
        size.after_full_claim(0, false);
        assert_eq!(size.get(), 10);
        size.after_full_claim(0, false);
        assert_eq!(size.get(), 10);
    }

    #[test]
    fn a_short_claim_sets_the_buffer_back_to_one_round_of_handlers() {
        let mut size = BufferSize::new(&WorkerConfig::default());
        size.after_full_claim(30, true);
        size.after_full_claim(30, true);
        assert_eq!(size.get(), 40);
        size.reset();
        assert_eq!(size.get(), 10);
    }

    #[test]
    fn a_set_prefetch_holds_the_buffer_at_its_size() {
        let mut size = BufferSize::new(&WorkerConfig {
            prefetch: Some(4),
            ..WorkerConfig::default()
        });
        size.after_full_claim(50, true);
        assert_eq!(size.get(), 4);
        let mut off = BufferSize::new(&WorkerConfig {
            prefetch: Some(0),
            ..WorkerConfig::default()
        });
        off.after_full_claim(50, true);
        assert_eq!((off.get(), off.low_water()), (0, 0));
    }
}
