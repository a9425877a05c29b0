//! The Tenax storage seam and its backends.
//!
//! [`Storage`] is the one trait through which Tenax touches a database: every state
//! change of a task is one of its methods, and each is one transaction guarded by a
//! conditional write. The runtime holds it as `Arc<dyn Storage>`, chosen at run time
//! from the database URL ([`connect`]); a database round trip costs far more than a
//! boxed future.
//!
//! **Implemented only in this workspace; it may change in any release.** Each backend
//! passes the conformance suite in [`testing`] (feature `testing`), which pins what
//! every method means.
//!
//! | backend | URL | feature | wake-ups |
//! |---|---|---|---|
//! | SQLite (WAL, `synchronous=FULL`) | `sqlite://PATH` | `sqlite` (default) | a probe of `PRAGMA data_version`, across processes |
//! | PostgreSQL 15 | `postgres://...[?schema=NAME]` | `postgres` | LISTEN/NOTIFY, across processes |
//! | MariaDB 10.11 (MySQL 8 where it costs nothing) | `mysql://...` or `mariadb://...` | `mysql` | a probe of the newest task id, across processes |
#![forbid(unsafe_code)]

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tenax_core::{AttemptRecord, TaskId, TaskRecord};

mod alert_state;
mod bulk;
mod common;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod dialect;
mod due;
mod error;
pub mod events;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod flow;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod flow_sql;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod outbox;
pub mod params;
mod pool;
#[cfg(feature = "postgres")]
pub mod postgres;
mod prune;
mod queue_stats;
mod rates;
mod redrive;
mod schedules;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod shared;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod transactional;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod wake;
pub mod workflows;

pub use alert_state::{AlertTransitionParams, ALERT_MESSAGE_MAX_BYTES};
pub use bulk::{
    AUDIT_ACTION_MAX_BYTES, AUDIT_ACTOR_MAX_BYTES, AUDIT_DETAILS_MAX_BYTES, AUDIT_LIST_MAX,
    AUDIT_TARGET_MAX_BYTES, BULK_IDS_MAX, BULK_LIMIT_MAX,
};
pub use common::{
    validate_insert, CONCURRENCY_KEY_MAX_BYTES, CONCURRENCY_LIMIT_MAX, CREATED_BY_MAX_BYTES,
    MAX_DELAY, NUL_REPLACEMENT, PAYLOAD_MAX_BYTES,
};
pub use due::{DueCount, TaskDueCountParams};
pub use error::{Result, StorageError};
pub use events::{
    EventCursorParams, EventKind, EventLease, EventLeaseParams, EventListParams, EventPage,
    EventPruneParams, EventRecord, EventRule, EventRuleParams, EventSequenceParams,
    EVENT_BATCH_MAX, EVENT_RESULT_MAX_BYTES, EVENT_SCHEMA, SEQUENCER_LEASE,
};
pub use outbox::{
    OutboxClaim, OutboxClaimParams, OutboxKind, OutboxListParams, OutboxOutcome, OutboxPruneParams,
    OutboxRecord, OutboxSendersParams, OutboxSettleParams, OutboxStat, OutboxStatsParams,
    OutboxStatus, CALLBACK_URL_MAX_BYTES, OUTBOX_BATCH_MAX, OUTBOX_ERROR_MAX_BYTES,
    OUTBOX_SENDER_GRACE, OUTBOX_SENDER_REFRESH,
};
pub use params::*;
pub use prune::{SidePruneParams, SidePruned};
/// The sqlx version Tenax is built with, so a caller's transaction has the types the
/// `enqueue_in` functions of each backend take.
pub use sqlx;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub use wake::DEFAULT_WAKE_POLL_INTERVAL;
pub use workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowKind,
    WorkflowListParams, WorkflowPolicy, WorkflowRecord, WorkflowState, WorkflowTask,
    WorkflowTaskParams,
};

/// Longest error text stored per attempt, in bytes; longer errors are truncated.
pub const ERROR_MAX_BYTES: usize = 4096;
/// Attempts kept in each task's history; older entries are dropped.
pub const ATTEMPT_HISTORY_LEN: i64 = 20;

/// What a backend can do beyond the common contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Other processes' enqueues wake this process's workers (PostgreSQL's LISTEN, the
    /// wake-up probe of SQLite and MariaDB).
    pub cross_process_wakeups: bool,
}

/// A receiver that changes whenever tasks may have become due (a hint, never data).
pub type WakeReceiver = tokio::sync::watch::Receiver<u64>;

/// A finish that a waiter registered for ([`Storage::task_wait_begin`]), pushed by a
/// backend that can ([`Storage::finishes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishHint {
    /// This task reached a final status.
    Task(TaskId),
    /// Hints may have been lost (the listener reconnected): every waiter reads again.
    Unknown,
}

/// The receiving end of [`Storage::finishes`].
pub type FinishReceiver = tokio::sync::broadcast::Receiver<FinishHint>;

/// The storage seam. See the [crate docs](crate).
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// The backend's name (`"sqlite"`).
    fn backend(&self) -> &'static str;

    /// What the backend can do.
    fn capabilities(&self) -> Capabilities;

    /// Apply pending schema migrations (idempotent; versioned).
    async fn migrate(&self) -> Result<()>;

    /// The database clock.
    async fn now(&self) -> Result<DateTime<Utc>>;

    /// A hint that tasks may be due, for workers in this process.
    fn wakeups(&self) -> WakeReceiver;

    /// The finishes of tasks that a waiter registered for with
    /// [`Storage::task_wait_begin`], where the backend pushes them (PostgreSQL's
    /// `NOTIFY`); `None` where a waiter must poll. Hints, never data: a waiter reads
    /// its task again when woken.
    fn finishes(&self) -> Option<FinishReceiver> {
        None
    }

    /// Record that someone waits for task `id` to finish, so that its finish is
    /// pushed to [`Storage::finishes`]; returns the waiter's key for
    /// [`Storage::task_wait_end`], or `None` where the backend pushes nothing. Read the
    /// task again after it: a finish is then either seen by that read or pushed.
    async fn task_wait_begin(&self, _id: TaskId) -> Result<Option<String>> {
        Ok(None)
    }

    /// The end of a wait begun with [`Storage::task_wait_begin`].
    async fn task_wait_end(&self, _waiter: &str) -> Result<()> {
        Ok(())
    }

    /// Insert a task, or return the existing one with the same `task_no`, type and
    /// payload; the same `task_no` with another type or payload is
    /// [`StorageError::TaskNoConflict`]. Returns only after the commit.
    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted>;

    /// One task, by id or number.
    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>>;

    /// Tasks matching filters, newest first.
    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>>;

    /// A task's attempt history, oldest first.
    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>>;

    /// Claim due tasks of the given queues and types, most urgent first then oldest
    /// run time: each becomes `running` with `attempt + 1`, `lease_epoch + 1`, a lease
    /// until now + TTL, and an open attempt-history entry.
    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>>;

    /// Renew leases that are still held (`running` under the same epoch); returns the
    /// leases renewed (task and epoch). A lease missing from the answer is lost.
    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>>;

    /// Mark a task succeeded, only if it is still `running` under the lease's epoch.
    /// Returns `false` (and writes nothing) when the lease was lost. For a compensation
    /// task, records the compensation state on the compensated task in the same
    /// transaction.
    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool>;

    /// Record a failed attempt, only if the task is still `running` under the lease's
    /// epoch: `retrying` after the delay, or `dead` (scheduling its compensation, or
    /// for a compensation task recording it failed). Returns `false` when the lease
    /// was lost.
    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool>;

    /// Move `running` tasks whose lease expired to `retrying` (run now) or, when out of
    /// attempts, `dead` — or `cancelled` when a cancel was requested; the expiry is
    /// re-checked in the write itself.
    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>>;

    /// Cancel a `pending`, `retrying` or `blocked` task at once. For a `running` task,
    /// record a cancel request and return the task still `running`: its worker learns
    /// of it at the next heartbeat ([`Storage::task_cancel_requested`]) and signals the
    /// handler; from then on a failed or handed-back attempt of the task ends it
    /// `cancelled` instead of retrying it (a success is still recorded as such).
    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord>;

    /// Return a `dead` task to `pending` with a fresh attempt budget; its history is
    /// kept.
    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord>;

    /// Delete finished tasks (and their history) older than the retention; returns how
    /// many. A dead task whose compensation has not finished is kept.
    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64>;

    /// Delete, at most `limit` rows per table, what pruned tasks leave behind: the
    /// dependency rows of pruned dependents, workflows with no task left, concurrency
    /// keys with no live task, and audit entries older than the audit retention. Each
    /// table is swept in its own transaction; a key row a claim holds, or a workflow a
    /// transaction is changing, is left for the next call. See the `prune` module.
    async fn side_prune(&self, params: &SidePruneParams) -> Result<SidePruned>;

    /// Counts by status and by command type.
    async fn stats(&self) -> Result<Stats>;

    /// The earliest run time after `now - since` of a waiting (`pending` or
    /// `retrying`) task the given queues and commands could claim, with the database's
    /// now, or `None`. Workers arm a timer for it, so
    /// a delayed task starts on time whatever the poll interval.
    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>>;

    /// The due backlog of each given queue (a queue without due tasks is reported with
    /// zero), in the order asked.
    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>>;

    /// The leases among those given whose task has a pending cancel request (see
    /// [`Storage::task_cancel`]): their handlers should be asked to stop.
    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>>;

    /// Store a periodic schedule, or update the one of the same name. A new schedule
    /// fires first at its first tick after now; an update that changes the cadence
    /// restarts from the first tick after now; a paused schedule stays paused. An
    /// invalid definition is [`StorageError::Invalid`] and changes nothing.
    async fn schedule_upsert(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)>;

    /// Every schedule, by name.
    async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>>;

    /// Pause a schedule, or resume it from its first tick after now (ticks that passed
    /// while it was paused never fire). [`StorageError::NotFound`] when missing.
    async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord>;

    /// Delete a schedule (the tasks it enqueued stay). [`StorageError::NotFound`] when
    /// missing.
    async fn schedule_remove(&self, name: &str) -> Result<()>;

    /// Fire the due ticks of up to `limit` schedules that are not paused: in one
    /// transaction per call, each due schedule (locked, skipping those another node
    /// holds) enqueues one task per tick its missed-tick policy keeps, numbered
    /// `sched:<name>:<tick>`, and its next fire time moves past now with a write
    /// conditional on the value read. A tick therefore fires once however many nodes
    /// call this at the same time.
    async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>>;

    /// Every queue that has waiting or running tasks or claim controls, by name, with
    /// its controls and counts.
    async fn queue_list(&self) -> Result<Vec<QueueInfo>>;

    /// Pause or resume a queue, or set or remove its limit on running tasks; returns the
    /// queue after the change. A paused queue is never claimed from; a limited queue
    /// never has more than `max_running` tasks running (claims that lock the queue row
    /// and count its running tasks decide it). A limit lower than what runs now stops
    /// further claims until enough finish; running tasks are not interrupted.
    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo>;

    /// Counts by queue and status, and per queue the backlog (due, unclaimed tasks) and
    /// how long its oldest due task has waited: what the metrics sampler reads. One
    /// read-only statement; its cost grows with the table, so call it at a bounded rate.
    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>>;

    /// Limit how fast tasks of a command type start, across all nodes: a token bucket of
    /// `burst` tokens refilled at `per_second` by the database clock; each claimed task
    /// takes one token, and a task without a token is not claimed (it spends no attempt
    /// and blocks no task of another type). A new bucket starts full; changing a bucket
    /// keeps its tokens (at most the new burst). Invalid settings are
    /// [`StorageError::Invalid`] and change nothing.
    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit>;

    /// Every rate limit, by command type.
    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>>;

    /// Remove a command type's rate limit. [`StorageError::NotFound`] when missing.
    async fn rate_limit_remove(&self, command_type: &str) -> Result<()>;

    /// Applies one action to every task matching the filter, in one statement per backend
    /// (plus the cancel requests for running tasks), in one transaction.
    ///
    /// Each action changes only the tasks the single-task action would, with the same
    /// guard re-checked in the write: a cancel cancels waiting execute tasks and records a
    /// cancel request on running execute tasks that have none yet (as
    /// [`Storage::task_cancel`]); a retry returns dead execute tasks whose compensation
    /// is not running to `pending` (as [`Storage::task_retry`]) and wakes the workers; a
    /// reprioritise sets the priority of waiting tasks. At most `limit` tasks are changed,
    /// lowest ids first. A limit outside 1..=[`BULK_LIMIT_MAX`] or more than
    /// [`BULK_IDS_MAX`] ids is [`StorageError::Invalid`] and changes nothing.
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome>;

    /// Records an operator action (database clock).
    ///
    /// Entries older than the audit retention are deleted by [`Storage::side_prune`].
    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord>;

    /// Lists recorded operator actions, newest first.
    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>>;

    /// Insert many tasks in one transaction (a statement per chunk of rows), each as
    /// [`Storage::task_insert`] would: a `task_no` that exists with the same type and
    /// payload is that task, one with another type or payload is reported as a
    /// conflict for that item, and the other items are inserted. Answers per item, in
    /// the order given. Every task is checked first: one invalid task refuses the call
    /// and inserts nothing.
    async fn task_insert_many(
        &self,
        params: &TaskInsertManyParams,
    ) -> Result<Vec<TaskInsertOutcome>>;

    /// Insert many tasks as [`Storage::task_insert_many`] does, all or nothing: in one
    /// transaction that commits only if `accept` returns `true` for the outcomes, which
    /// it is given before the commit. Otherwise the transaction is rolled back and
    /// nothing is written; the outcomes then say what each item would have done (a
    /// `Created` item names a task that was not kept). Every task is checked first, as
    /// by [`Storage::task_insert_many`]. Workers are woken only after a commit that
    /// made a new task.
    async fn task_insert_many_if(
        &self,
        params: &TaskInsertManyParams,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked>;

    /// Insert a workflow in one transaction: its row, its tasks (a task with parents
    /// waits `blocked`) and its dependencies. Keys, references, cycles, a saga's chain
    /// and every task are checked first; a refusal ([`StorageError::Invalid`]) inserts
    /// nothing, as does a `task_no` that already exists.
    ///
    /// Afterwards, the transaction that finishes a task of the workflow also moves its
    /// dependents: when it succeeded, their counts of unfinished parents drop by one
    /// and those at zero become `pending`; when it died or was cancelled, its
    /// dependents are cancelled, transitively ([`WorkflowPolicy::CancelDependents`]),
    /// or counted down as on success ([`WorkflowPolicy::RunAnyway`]). In a saga, a
    /// step that dies is compensated and then the steps before it that succeeded, in
    /// reverse order, each compensation scheduled by the transaction that finishes the
    /// previous one; the saga's state is written by the transaction that decides it.
    async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail>;

    /// A workflow and its tasks, or `None`.
    async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>>;

    /// Workflows, newest first.
    async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>>;

    /// The parents of a task in its workflow, with their results (empty for a task
    /// without parents).
    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<ParentOutcome>>;

    /// Claim up to `limit` due `pending` outbox rows of a kind, oldest first, skipping
    /// rows another claimer holds: each gets `attempts + 1` and is hidden until now +
    /// `lease`. See [`outbox`].
    async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>>;

    /// End claims with one outcome, in one conditional statement: only rows still
    /// `pending` under the claimed attempt count change. Returns how many did (fewer
    /// than asked when a claim lapsed and another claimer took the row).
    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64>;

    /// Outbox rows matching filters, oldest first.
    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>>;

    /// Delete delivered and expired outbox rows settled before now - `older_than`, and
    /// pending rows written before then (no sender took them in all that time, for
    /// example death rows where no alert webhook is configured); returns how many.
    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64>;

    /// Record that a sender of these kinds runs, at the database clock: a `death`
    /// row is written only while a `death` sender is recorded, and only the kinds
    /// recorded are counted by [`Storage::outbox_stats`]. See [`outbox`].
    async fn outbox_senders_seen(&self, params: &OutboxSendersParams) -> Result<()>;

    /// Record whether a threshold alert of a queue is firing; returns `true` only when
    /// this call changed it (an alert never recorded counts as not firing). Concurrent
    /// callers asking for the same change: exactly one gets `true`.
    async fn alert_transition(&self, params: &AlertTransitionParams) -> Result<bool>;

    /// The workflow a task belongs to: `None` for a task enqueued on its own (a
    /// compensation task belongs to no workflow) and for an unknown id.
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>>;

    /// Tasks that succeeded or died at or after `since`, the latest to finish first, at
    /// most `limit` (read through the index of finished tasks, however many the table
    /// keeps). What a dashboard charts for the last hour: payloads and results are
    /// left out (the empty string, as [`TaskListParams::value_max_bytes`] describes).
    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>>;

    /// Complete many tasks in one transaction, each exactly as
    /// [`Storage::task_complete_if_leased`] would: a task is marked succeeded only if it
    /// is still `running` under its lease's epoch, and its attempt-history entry is
    /// closed. Answers per item, in the order given ([`BatchCompletion`]): landed, lease
    /// lost (nothing of it written; also for a lease named earlier in the batch), or
    /// left alone. A backend may leave alone (write nothing for) a task whose completion
    /// moves other tasks — a workflow task or a compensation — for the caller to
    /// complete with [`Storage::task_complete_if_leased`]; a backend that completes it
    /// in the batch moves its dependents as that method would.
    ///
    /// Nothing is written unless the whole batch commits: an error means none of the
    /// items landed by this call. At most [`COMPLETE_MANY_MAX`] items per call; more is
    /// [`StorageError::Invalid`].
    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<BatchCompletion>>;

    /// The outbox's pending rows per kind: how many, and how long the oldest has
    /// waited (database clock). A kind without pending rows is left out, and so is a
    /// kind no sender is recorded for (nothing would send those rows: they are not
    /// late, and the pruner expires them).
    async fn outbox_stats(&self, params: &OutboxStatsParams) -> Result<Vec<OutboxStat>>;

    /// How many waiting (`pending` or `retrying`) tasks of one type, in the given
    /// queues and of a payload version the caller decodes, are due now, counting at
    /// most `limit`, with the run time of the oldest: what a batch command's worker
    /// asks to decide whether to claim a batch now or wait for it to fill. Read-only;
    /// a hint that the claim itself re-checks.
    async fn task_due_count(&self, params: &TaskDueCountParams) -> Result<DueCount>;

    /// Add (or keep) or remove an event rule; returns whether this call changed the
    /// rules. Tasks inserted afterwards whose queue and command type a rule covers
    /// write task events (see [`events`]); tasks already inserted keep what was decided
    /// at their insert. An invalid queue or type is [`StorageError::Invalid`] and
    /// changes nothing.
    async fn event_rule_set(&self, params: &EventRuleParams) -> Result<bool>;

    /// Every event rule, by queue then command type (any first).
    async fn event_rule_list(&self) -> Result<Vec<EventRule>>;

    /// Take or renew the lease of a single-holder role of the event pipeline (the
    /// sequencer or a relay): granted when the row is free, lapsed, or already this
    /// holder's; the epoch is bumped unless this holder renews a lease it still holds.
    /// `None` when another holder has it. Concurrent callers: at most one holds it.
    async fn event_lease(&self, params: &EventLeaseParams) -> Result<Option<EventLease>>;

    /// Under the sequencer lease, give up to `limit` committed events without a
    /// position the next positions, in row order, in one transaction; returns how
    /// many, or `None` (and writes nothing) when the lease is no longer held under its
    /// epoch.
    async fn event_sequence(&self, params: &EventSequenceParams) -> Result<Option<u64>>;

    /// Under a relay's lease, record the last position it delivered (never moving
    /// backwards); `false` (and nothing written) when the lease is no longer held
    /// under its epoch.
    async fn event_cursor_advance(&self, params: &EventCursorParams) -> Result<bool>;

    /// Sequenced events after a position, by position, with the stream's head and
    /// how far it was pruned.
    async fn event_list(&self, params: &EventListParams) -> Result<EventPage>;

    /// Delete the sequenced events sequenced before now - `older_than` that every
    /// named relay delivered, as a prefix of the stream, and record how far the stream
    /// is pruned; returns how many were deleted.
    async fn event_prune(&self, params: &EventPruneParams) -> Result<u64>;
}

/// Most completions [`Storage::task_complete_many_if_leased`] takes in one call.
pub const COMPLETE_MANY_MAX: usize = 1000;

/// Open the backend a URL names and apply its migrations.
///
/// - `sqlite://PATH` (the file is created when missing; `sqlite::memory:` is refused
///   because each pooled connection would see its own database);
/// - `postgres://...` or `postgresql://...` (feature `postgres`); `?schema=NAME` keeps
///   Tenax's tables in that schema (created when missing);
/// - `mysql://...` or `mariadb://...` (feature `mysql`).
pub async fn connect(url: &str) -> Result<Arc<dyn Storage>> {
    let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let storage = sqlite::SqliteStorage::connect(url).await?;
            storage.migrate().await?;
            Ok(Arc::new(storage))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let storage = postgres::PgStorage::connect(url).await?;
            storage.migrate().await?;
            Ok(Arc::new(storage))
        }
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => {
            let storage = mysql::MySqlStorage::connect(url).await?;
            storage.migrate().await?;
            Ok(Arc::new(storage))
        }
        _ => Err(StorageError::UnsupportedUrl(url.to_owned())),
    }
}
