//! The client: enqueue, inspect, cancel and retry tasks.
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tenax_core::{
    AttemptRecord, Command, CommandDefaults, InvalidInput, Priority, QueueName, TaskId, TaskNo,
    TaskRecord,
};
use tenax_storage::{
    AuditListParams, AuditRecord, BulkAction, EventRule, EventRuleParams, QueueChange, QueueInfo,
    QueueUpdateParams, RateLimit, RateLimitSetParams, RunAt, Stats, Storage, TaskActionParams,
    TaskBulkOutcome, TaskBulkParams, TaskFilter, TaskInsertManyChecked, TaskInsertManyParams,
    TaskInsertOutcome, TaskInsertParams, TaskInserted, TaskListParams, TaskRef,
};

use crate::error::Error;

/// A handle on the task store, for code that enqueues and inspects tasks.
///
/// Cheap to clone; share one per process.
///
/// ```
/// # use tenax_core::{Command, CommandError, TaskContext};
/// # struct Ping;
/// # impl Command for Ping {
/// #     const TYPE: &'static str = "PING";
/// #     type Context = u32;
/// #     type Output = ();
/// #     async fn execute(&self, _: u32, _: &TaskContext) -> Result<(), CommandError> { Ok(()) }
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// # let dir = tempfile::tempdir().unwrap();
/// # let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
/// let client = tenax_runtime::Client::connect(&url).await?;
/// let first = client.enqueue::<Ping>(7).task_no("PING-7").await?;
/// let again = client.enqueue::<Ping>(7).task_no("PING-7").await?;
/// assert!(first.created && !again.created, "one task per task_no");
/// assert_eq!(first.task.id, again.task.id);
/// // The same number with another payload is a conflict, not a silent success.
/// assert!(client.enqueue::<Ping>(8).task_no("PING-7").await.is_err());
/// # Ok::<(), tenax_runtime::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct Client {
    storage: Arc<dyn Storage>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("backend", &self.storage.backend())
            .finish()
    }
}

impl Client {
    /// A client over an open storage.
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        Self { storage }
    }

    /// Open the database a URL names (applying migrations) and return a client.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Ok(Self::new(tenax_storage::connect(url).await?))
    }

    /// The storage, to share with a [`Worker`](crate::Worker).
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Enqueue a task of command `C`, with `C`'s defaults; adjust with the builder's
    /// methods, then `.await` it. Returns once the task is committed. The payload is
    /// stored with `C::VERSION`, its shape version.
    pub fn enqueue<C: Command>(&self, context: C::Context) -> Enqueue<'_> {
        let params = serde_json::to_string(&context)
            .map_err(Error::from)
            .and_then(|payload| Ok((payload, Priority::new(C::PRIORITY)?)));
        Enqueue {
            client: self,
            numbered: false,
            params: params.map(|(payload, priority)| TaskInsertParams {
                task_no: TaskNo::from_stored(String::new()),
                command_type: C::TYPE.to_owned(),
                payload,
                payload_version: C::VERSION,
                queue: C::QUEUE.to_owned(),
                priority,
                max_attempts: C::MAX_ATTEMPTS,
                timeout: C::TIMEOUT,
                run_at: RunAt::Now,
                now: None,
                concurrency_key: None,
                concurrency_limit: 1,
                callback_url: None,
                created_by: None,
            }),
        }
    }

    /// Enqueue a task by type name and JSON payload (for tools that have no Rust type).
    /// The payload is stored as version 1; set another with
    /// [`payload_version`](Enqueue::payload_version).
    pub fn enqueue_raw(&self, command_type: &str, payload: &serde_json::Value) -> Enqueue<'_> {
        Enqueue {
            client: self,
            numbered: false,
            params: Ok(TaskInsertParams {
                task_no: TaskNo::from_stored(String::new()),
                command_type: command_type.to_owned(),
                payload: payload.to_string(),
                payload_version: 1,
                queue: CommandDefaults::STANDARD.queue.to_owned(),
                priority: Priority::DEFAULT,
                max_attempts: CommandDefaults::STANDARD.max_attempts,
                timeout: CommandDefaults::STANDARD.timeout,
                run_at: RunAt::Now,
                now: None,
                concurrency_key: None,
                concurrency_limit: 1,
                callback_url: None,
                created_by: None,
            }),
        }
    }

    /// Enqueue many tasks in one transaction (a statement per chunk of rows), each
    /// built as for a single enqueue (`client.enqueue::<C>(ctx).task_no(..)`). Each
    /// `task_no` is idempotent as for [`enqueue`](Client::enqueue): an existing task with
    /// the same type and payload is reported as existing, one with another type or
    /// payload as a conflict for that item (the other items are still inserted). The
    /// answers are per item, in order. An invalid item refuses the whole call; nothing
    /// is inserted then.
    pub async fn enqueue_many<'a>(
        &self,
        tasks: impl IntoIterator<Item = Enqueue<'a>>,
    ) -> Result<Vec<TaskInsertOutcome>, Error> {
        let tasks = many_params(tasks)?;
        Ok(self
            .storage
            .task_insert_many(&TaskInsertManyParams { tasks, now: None })
            .await?)
    }

    /// Enqueue many tasks as [`enqueue_many`](Client::enqueue_many) does, all or
    /// nothing: in one transaction that commits only if `accept` returns `true` for
    /// the per-item outcomes, which it is given before the commit. Otherwise the
    /// transaction is rolled back and nothing is stored; the outcomes then say what
    /// each item would have done (a `Created` item names a task that was not kept).
    /// An invalid item refuses the whole call, before `accept` is asked.
    ///
    /// For a batch that must be stored whole or not at all, e.g. refused when any
    /// item is a conflict: `|outcomes| !outcomes.iter().any(|o| matches!(o,
    /// TaskInsertOutcome::Conflict { .. }))`.
    pub async fn enqueue_many_if<'a>(
        &self,
        tasks: impl IntoIterator<Item = Enqueue<'a>>,
        accept: impl Fn(&[TaskInsertOutcome]) -> bool + Send + Sync,
    ) -> Result<TaskInsertManyChecked, Error> {
        let tasks = many_params(tasks)?;
        Ok(self
            .storage
            .task_insert_many_if(&TaskInsertManyParams { tasks, now: None }, &accept)
            .await?)
    }

    /// A task by id or number.
    pub async fn get(&self, task: &TaskRef) -> Result<Option<TaskRecord>, Error> {
        Ok(self.storage.task_get(task).await?)
    }

    /// Tasks matching filters, newest first.
    pub async fn list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>, Error> {
        Ok(self.storage.task_list(params).await?)
    }

    /// A task's attempt history, oldest first (the last 20 attempts).
    pub async fn attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>, Error> {
        Ok(self.storage.task_attempts(id).await?)
    }

    /// Cancel a task. One that has not started (`pending`, `retrying`, `blocked`) is
    /// `cancelled` at once. For a `running` task the cancel is recorded as a request
    /// and the task is returned still `running`: its worker signals the handler's
    /// [cancellation token](tenax_core::TaskContext::cancellation) at its next
    /// heartbeat, and when the handler stops without succeeding the task ends
    /// `cancelled`. A handler that ignores the request is stopped at its timeout.
    pub async fn cancel(&self, task: TaskRef) -> Result<TaskRecord, Error> {
        Ok(self
            .storage
            .task_cancel(&TaskActionParams { task, now: None })
            .await?)
    }

    /// Retry a dead task with a fresh attempt budget (its history is kept).
    pub async fn retry(&self, task: TaskRef) -> Result<TaskRecord, Error> {
        Ok(self
            .storage
            .task_retry(&TaskActionParams { task, now: None })
            .await?)
    }

    /// Counts by status and command type.
    pub async fn stats(&self) -> Result<Stats, Error> {
        Ok(self.storage.stats().await?)
    }
}

/// The inserts of `tasks`, each numbered; the first invalid one refuses them all.
fn many_params<'a>(
    tasks: impl IntoIterator<Item = Enqueue<'a>>,
) -> Result<Vec<TaskInsertParams>, Error> {
    tasks.into_iter().map(Enqueue::into_params).collect()
}

/// An enqueue being built; `.await` it to commit.
#[must_use = "an enqueue does nothing until awaited"]
pub struct Enqueue<'a> {
    client: &'a Client,
    params: Result<TaskInsertParams, Error>,
    /// Whether `params` holds the task's number: one given by `task_no`, or one
    /// generated by [`params`](Enqueue::params) or
    /// [`into_params`](Enqueue::into_params). Until then `params` holds an empty
    /// number (which never leaves the builder): a number generated up front is wasted
    /// work when one is given.
    numbered: bool,
}

impl Enqueue<'_> {
    /// The insert this builder makes, without making it: for
    /// [`Client::enqueue_many`] and for the backends' `enqueue_in` functions, which
    /// insert inside a transaction of the caller's (for example
    /// `tenax::storage::postgres::enqueue_in`).
    pub fn into_params(mut self) -> Result<TaskInsertParams, Error> {
        self.number();
        self.params
    }

    /// The insert this builder will make, to look at before awaiting it: a caller
    /// that checks its own limits first (the HTTP API checks the queue's waiting
    /// count, which needs the task's queue and number) reads it here. The error is
    /// the builder's first refusal, the one awaiting it would return.
    ///
    /// It fixes the task's number first: unless [`task_no`](Enqueue::task_no) gave
    /// one, a fresh UUIDv7 is drawn now, and the insert uses that number.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let url = format!("sqlite://{}", dir.path().join("tenax.db").display());
    /// let client = tenax_runtime::Client::connect(&url).await?;
    /// let mut task = client.enqueue_raw("PING", &serde_json::json!({})).queue("pings");
    /// let params = task.params().expect("the builder refused nothing");
    /// assert_eq!(params.queue, "pings");
    /// let task_no = params.task_no.clone();
    /// // ... the caller's own checks, then:
    /// let inserted = task.await?;
    /// assert_eq!(inserted.task.task_no, task_no);
    /// # Ok::<(), tenax_runtime::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn params(&mut self) -> Result<&TaskInsertParams, &Error> {
        self.number();
        self.params.as_ref()
    }

    /// Give the task a fresh number unless it has one.
    fn number(&mut self) {
        if !self.numbered {
            if let Ok(params) = &mut self.params {
                params.task_no = TaskNo::generate();
            }
            self.numbered = true;
        }
    }

    fn map(mut self, f: impl FnOnce(&mut TaskInsertParams) -> Result<(), Error>) -> Self {
        if let Ok(params) = &mut self.params {
            if let Err(e) = f(params) {
                self.params = Err(e);
            }
        }
        self
    }

    /// The business number (idempotency key). Defaults to a fresh UUIDv7.
    pub fn task_no(self, task_no: impl Into<String>) -> Self {
        let task_no = task_no.into();
        let mut this = self.map(|p| {
            p.task_no = TaskNo::new(task_no)?;
            Ok(())
        });
        this.numbered = true;
        this
    }

    /// The queue. Defaults to the command's.
    pub fn queue(self, queue: impl Into<String>) -> Self {
        let queue = queue.into();
        self.map(|p| {
            p.queue = QueueName::new(queue)?.to_string();
            Ok(())
        })
    }

    /// Priority 0-9. Defaults to the command's.
    pub fn priority(self, priority: u8) -> Self {
        self.map(|p| {
            p.priority = Priority::new(priority)?;
            Ok(())
        })
    }

    /// The attempt budget (at least 1). Defaults to the command's.
    pub fn max_attempts(self, max_attempts: u32) -> Self {
        self.map(|p| {
            if max_attempts == 0 {
                return Err(InvalidInput::new("max_attempts", "must be at least 1").into());
            }
            p.max_attempts = max_attempts;
            Ok(())
        })
    }

    /// Where to POST the task's final outcome (succeeded, dead or cancelled): an
    /// `http` or `https` URL. A process running a callback sender (`tenax worker` or
    /// `tenax serve` with `[callbacks]`) delivers it, signed, until acknowledged;
    /// that sender also checks the host against its allow-list.
    pub fn callback_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.map(|p| {
            p.callback_url = Some(url);
            Ok(())
        })
    }

    /// The name of whoever enqueues the task, stored with it (the HTTP API stores
    /// the name of the caller's API token, and lets an enqueue-only token read only
    /// the tasks stored under its name): 1 to
    /// [`CREATED_BY_MAX_BYTES`](tenax_storage::CREATED_BY_MAX_BYTES) bytes, checked
    /// when the task is stored. None by default. Not part of the task's identity: a
    /// repeat of an existing `task_no` keeps the name stored first.
    pub fn created_by(self, name: impl Into<String>) -> Self {
        let name = name.into();
        self.map(|p| {
            p.created_by = Some(name);
            Ok(())
        })
    }

    /// The per-attempt timeout. Defaults to the command's.
    pub fn timeout(self, timeout: Duration) -> Self {
        self.map(|p| {
            if timeout.is_zero() {
                return Err(InvalidInput::new("timeout", "must be positive").into());
            }
            p.timeout = timeout;
            Ok(())
        })
    }

    /// The payload's shape version (at least 1). Defaults to `C::VERSION` for
    /// [`Client::enqueue`] and 1 for [`Client::enqueue_raw`]. A worker claims the task
    /// only if it knows this version of the command.
    pub fn payload_version(self, version: u32) -> Self {
        self.map(|p| {
            if version == 0 {
                return Err(InvalidInput::new("payload_version", "must be at least 1").into());
            }
            p.payload_version = version;
            Ok(())
        })
    }

    /// A business key: at most [`concurrency_limit`](Enqueue::concurrency_limit) tasks
    /// with this key (1 by default) run at once, across all nodes; the others wait,
    /// without blocking tasks of other keys. At most 160 bytes, no control characters.
    pub fn concurrency_key(self, key: impl Into<String>) -> Self {
        let key = key.into();
        self.map(|p| {
            p.concurrency_key = Some(key);
            Ok(())
        })
    }

    /// How many tasks of this task's [`concurrency_key`](Enqueue::concurrency_key) may
    /// run at once, 1..=1000 (default 1). Checked when the task is stored.
    pub fn concurrency_limit(self, limit: u32) -> Self {
        self.map(|p| {
            p.concurrency_limit = limit;
            Ok(())
        })
    }

    /// Run no sooner than `delay` from now (database clock).
    pub fn run_in(self, delay: Duration) -> Self {
        self.map(|p| {
            p.run_at = RunAt::In(delay);
            Ok(())
        })
    }

    /// Run no sooner than `at`.
    pub fn run_at(self, at: DateTime<Utc>) -> Self {
        self.map(|p| {
            p.run_at = RunAt::At(at);
            Ok(())
        })
    }
}

impl<'a> IntoFuture for Enqueue<'a> {
    type Output = Result<TaskInserted, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let client = self.client;
            let params = self.into_params()?;
            Ok(client.storage.task_insert(&params).await?)
        })
    }
}

/// Queue controls: pause, resume and per-queue limits on running tasks, honoured by
/// every node's claims.
impl Client {
    /// Every queue with waiting or running tasks or with controls, by name.
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, Error> {
        Ok(self.storage.queue_list().await?)
    }

    /// Stop claiming from a queue (its running tasks finish; its other tasks wait).
    pub async fn pause_queue(&self, queue: &str) -> Result<QueueInfo, Error> {
        self.queue_update(queue, QueueChange::Pause).await
    }

    /// Claim from a paused queue again.
    pub async fn resume_queue(&self, queue: &str) -> Result<QueueInfo, Error> {
        self.queue_update(queue, QueueChange::Resume).await
    }

    /// At most `max_running` tasks of the queue run at once across all nodes (at least
    /// 1); `None` removes the limit. A lower limit than what runs now lets the running
    /// tasks finish and stops claims until the queue is under it.
    pub async fn set_queue_limit(
        &self,
        queue: &str,
        max_running: Option<u32>,
    ) -> Result<QueueInfo, Error> {
        self.queue_update(queue, QueueChange::MaxRunning(max_running))
            .await
    }

    async fn queue_update(&self, queue: &str, change: QueueChange) -> Result<QueueInfo, Error> {
        Ok(self
            .storage
            .queue_update(&QueueUpdateParams {
                queue: queue.to_owned(),
                change,
                now: None,
            })
            .await?)
    }
}

impl Client {
    /// Limit how fast tasks of a command type start across all nodes: a token bucket of
    /// `burst` tasks refilled at `per_second` (above 0, at most 1e6; burst 1..=1e6). A
    /// task without a token waits without spending an attempt, and other types are
    /// claimed meanwhile. Setting it again changes the rate and burst.
    pub async fn set_rate_limit(
        &self,
        command_type: &str,
        per_second: f64,
        burst: u32,
    ) -> Result<RateLimit, Error> {
        Ok(self
            .storage
            .rate_limit_set(&RateLimitSetParams {
                command_type: command_type.to_owned(),
                per_second,
                burst,
                now: None,
            })
            .await?)
    }

    /// Every rate limit, by command type.
    pub async fn rate_limits(&self) -> Result<Vec<RateLimit>, Error> {
        Ok(self.storage.rate_limit_list().await?)
    }

    /// Remove a command type's rate limit (not found when it has none).
    pub async fn remove_rate_limit(&self, command_type: &str) -> Result<(), Error> {
        Ok(self.storage.rate_limit_remove(command_type).await?)
    }
}

impl Client {
    /// Tasks inserted from now on in `queue` and/or of `command_type` write task events
    /// (with neither: every task), as `tenax events on` and `POST /v1/events/rules` do.
    /// `false` when the rule was there already. An invalid queue or type changes
    /// nothing.
    pub async fn events_on(
        &self,
        queue: Option<&str>,
        command_type: Option<&str>,
    ) -> Result<bool, Error> {
        self.event_rule(queue, command_type, true).await
    }

    /// Remove the rule [`events_on`](Client::events_on) added for the same `queue` and
    /// `command_type`; tasks already inserted keep writing events. `false` when there
    /// was no such rule.
    pub async fn events_off(
        &self,
        queue: Option<&str>,
        command_type: Option<&str>,
    ) -> Result<bool, Error> {
        self.event_rule(queue, command_type, false).await
    }

    /// Every event rule, by queue then command type (any first).
    pub async fn event_rules(&self) -> Result<Vec<EventRule>, Error> {
        Ok(self.storage.event_rule_list().await?)
    }

    async fn event_rule(
        &self,
        queue: Option<&str>,
        command_type: Option<&str>,
        enabled: bool,
    ) -> Result<bool, Error> {
        Ok(self
            .storage
            .event_rule_set(&EventRuleParams {
                queue: queue.map(ToOwned::to_owned),
                command_type: command_type.map(ToOwned::to_owned),
                enabled,
                now: None,
            })
            .await?)
    }
}

impl Client {
    /// Cancel, retry or reprioritise at most `limit` tasks (1 to 100,000) matching
    /// `filter`, in one transaction, as `tenax tasks bulk` and `POST /v1/tasks/bulk/*`
    /// do (those also record an audit entry; record one with
    /// [`Storage::audit_append`](tenax_storage::Storage::audit_append) if yours must
    /// be audited). A bad filter or limit changes nothing.
    pub async fn bulk(
        &self,
        filter: TaskFilter,
        action: BulkAction,
        limit: u32,
    ) -> Result<TaskBulkOutcome, Error> {
        Ok(self
            .storage
            .task_bulk(&TaskBulkParams {
                filter,
                action,
                limit,
                now: None,
            })
            .await?)
    }

    /// Recorded operator actions, newest first, as `tenax audit list` and `GET
    /// /v1/audit` show them.
    pub async fn audit(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>, Error> {
        Ok(self.storage.audit_list(params).await?)
    }
}
