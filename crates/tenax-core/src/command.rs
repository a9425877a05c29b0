//! The command pattern: one type per kind of background job.
use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::error::CommandError;
use crate::retry::RetryPolicy;
use crate::task::{Priority, QueueName, TaskId, TaskKind, TaskNo};

/// One kind of background job.
///
/// A command is registered as an *instance*: its `&self` carries whatever clients it
/// needs (an HTTP client, a connection pool), so no global state is involved. Only
/// [`execute`](Command::execute) is required; everything else has a default.
///
/// ```
/// use std::time::Duration;
/// use serde::{Deserialize, Serialize};
/// use tenax_core::{Command, CommandError, TaskContext};
///
/// #[derive(Serialize, Deserialize)]
/// struct OpenAccount { customer: String }
///
/// struct OpenBankAccount; // would hold the bank's client
///
/// impl Command for OpenBankAccount {
///     const TYPE: &'static str = "BANK_OPEN_ACCOUNT";
///     const MAX_ATTEMPTS: u32 = 8;
///     type Context = OpenAccount;
///     type Output = String;
///
///     async fn execute(&self, ctx: OpenAccount, task: &TaskContext) -> Result<String, CommandError> {
///         // Pass the idempotency key downstream so a retry after an unknown
///         // outcome does not open a second account.
///         Ok(format!("account for {} ({})", ctx.customer, task.idempotency_key()))
///     }
///
///     async fn compensate(&self, ctx: OpenAccount, task: &TaskContext) -> Result<(), CommandError> {
///         // Cancel the pending account; keyed by task.idempotency_key() too.
///         let _ = (ctx, task);
///         Ok(())
///     }
/// }
/// ```
pub trait Command: Send + Sync + 'static {
    /// The stable type name stored with each task (`"BANK_OPEN_ACCOUNT"`). Changing it
    /// orphans the tasks already stored under the old name.
    const TYPE: &'static str;
    /// Attempts before the task is dead. Defaults to 5
    /// ([`CommandDefaults::STANDARD`](crate::CommandDefaults::STANDARD)).
    const MAX_ATTEMPTS: u32 = crate::CommandDefaults::STANDARD.max_attempts;
    /// Time allowed for one attempt before it counts as a retryable failure. Defaults to
    /// 30 minutes: long enough for real work, short enough that a hung handler does not
    /// hold its slot for hours. Heartbeats keep the lease alive meanwhile.
    const TIMEOUT: Duration = crate::CommandDefaults::STANDARD.timeout;
    /// The queue tasks of this command go to. Defaults to `"default"`.
    const QUEUE: &'static str = QueueName::DEFAULT;
    /// Priority 0-9 (9 most urgent). Defaults to 5.
    const PRIORITY: u8 = Priority::DEFAULT.get();
    /// The shape version of [`Context`](Command::Context), stored with every task
    /// enqueued for this command. Defaults to 1 (at least 1).
    ///
    /// Raise it when the context changes shape in a way the previous shape does not
    /// decode into, and teach [`upcast`](Command::upcast) to turn every older shape into
    /// the current one. During a rolling deploy, a worker claims only tasks whose stored
    /// version is at most the version it knows: a task enqueued by a newer node waits
    /// for a worker of that version instead of dying on decode in an older one.
    const VERSION: u32 = 1;

    /// The typed context (payload), stored as JSON.
    type Context: Serialize + DeserializeOwned + Send + 'static;
    /// What a successful run returns, stored as JSON as the task's result.
    type Output: Serialize + Send + 'static;

    /// Run the command. The error's variant is the retry decision.
    fn execute(
        &self,
        ctx: Self::Context,
        task: &TaskContext,
    ) -> impl Future<Output = Result<Self::Output, CommandError>> + Send;

    /// Undo what the command may have done, once its task is dead (attempts used up or
    /// a permanent error), or, for a step of a saga that succeeded, once a later step
    /// died. It runs durably as a linked task, with its own retries, and
    /// is recorded as finished exactly once; make its side effects idempotent with
    /// [`TaskContext::idempotency_key`]. The cause of death is in
    /// [`TaskContext::cause`]. Defaults to no compensation.
    fn compensate(
        &self,
        ctx: Self::Context,
        task: &TaskContext,
    ) -> impl Future<Output = Result<(), CommandError>> + Send {
        let _ = (ctx, task);
        async { Err(CommandError::NoCompensation) }
    }

    /// Turn a payload stored by an older version of this command into the current
    /// shape ([`VERSION`](Command::VERSION)).
    ///
    /// Called before decoding, only when the stored version is lower than `VERSION`. It
    /// receives the stored version and the stored payload as JSON, and must return the
    /// payload in the current shape, in one call: it is not called once per version
    /// step (chain the steps inside it if there are several). A payload that cannot be
    /// upcast is a [`CommandError::Permanent`]: the task is dead and its compensation
    /// runs (with the same upcast context). Defaults to returning the payload unchanged,
    /// which suits additions that decode with `#[serde(default)]`.
    ///
    /// ```
    /// use serde::{Deserialize, Serialize};
    /// use serde_json::{json, Value};
    /// use tenax_core::{Command, CommandError, TaskContext};
    ///
    /// // Version 1 stored {"name": "Ada Lovelace"}; version 2 splits the name.
    /// #[derive(Serialize, Deserialize)]
    /// struct Greeting { first: String, last: String }
    ///
    /// struct Greet;
    ///
    /// impl Command for Greet {
    ///     const TYPE: &'static str = "GREET";
    ///     const VERSION: u32 = 2;
    ///     type Context = Greeting;
    ///     type Output = String;
    ///
    ///     async fn execute(&self, ctx: Greeting, _: &TaskContext) -> Result<String, CommandError> {
    ///         Ok(format!("hello {} {}", ctx.first, ctx.last))
    ///     }
    ///
    ///     fn upcast(version: u32, payload: Value) -> Result<Value, CommandError> {
    ///         match version {
    ///             1 => {
    ///                 let name = payload["name"]
    ///                     .as_str()
    ///                     .ok_or_else(|| CommandError::permanent("v1 payload has no name"))?;
    ///                 let (first, last) = name.split_once(' ').unwrap_or((name, ""));
    ///                 Ok(json!({ "first": first, "last": last }))
    ///             }
    ///             other => Err(CommandError::permanent(format!("unknown version {other}"))),
    ///         }
    ///     }
    /// }
    ///
    /// let v2 = Greet::upcast(1, json!({ "name": "Ada Lovelace" })).unwrap();
    /// assert_eq!(v2, json!({ "first": "Ada", "last": "Lovelace" }));
    /// ```
    fn upcast(version: u32, payload: serde_json::Value) -> Result<serde_json::Value, CommandError> {
        let _ = version;
        Ok(payload)
    }

    /// Backoff between attempts. Defaults to [`RetryPolicy::default`]: 5 s × 2^(n−1)
    /// with full jitter, capped at 1 hour.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }
}

/// What a handler knows about the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    id: TaskId,
    task_no: TaskNo,
    kind: TaskKind,
    attempt: u32,
    max_attempts: u32,
    lease_epoch: i64,
    idempotency_key: String,
    cause: Option<String>,
    cancellation: CancellationToken,
    concurrency_key: Option<String>,
    pub(crate) parents: Option<crate::parents::Parents>,
    /// Set once the handler committed the task's completion itself (shared by clones).
    completed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl TaskContext {
    /// Build a context. Called by the runtime (and by tests that call handlers directly).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: TaskId,
        task_no: TaskNo,
        kind: TaskKind,
        attempt: u32,
        max_attempts: u32,
        lease_epoch: i64,
        idempotency_key: String,
        cause: Option<String>,
        cancellation: CancellationToken,
    ) -> Self {
        Self {
            id,
            task_no,
            kind,
            attempt,
            max_attempts,
            lease_epoch,
            idempotency_key,
            cause,
            cancellation,
            concurrency_key: None,
            parents: None,
            completed: std::sync::Arc::default(),
        }
    }

    /// The same context, for a task with this business concurrency key.
    pub fn with_concurrency_key(mut self, key: Option<String>) -> Self {
        self.concurrency_key = key;
        self
    }

    /// The task's business concurrency key, if it has one.
    pub fn concurrency_key(&self) -> Option<&str> {
        self.concurrency_key.as_deref()
    }

    /// The task's database id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task's business number.
    pub fn task_no(&self) -> &TaskNo {
        &self.task_no
    }

    /// Whether this run executes or compensates the command.
    pub fn kind(&self) -> TaskKind {
        self.kind
    }

    /// This attempt's number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The attempt budget.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Whether this is the last attempt of the budget.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }

    /// The lease epoch (fencing token) of this attempt.
    pub fn lease_epoch(&self) -> i64 {
        self.lease_epoch
    }

    /// A key that is the same for every attempt of this task (the seed article's
    /// `biz_request_id`): pass it downstream so a retry after an unknown outcome is
    /// recognised as a repeat. It is derived from the `task_no`; a compensation has
    /// its own key, derived from the `task_no` of the task it compensates.
    pub fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }

    /// For a compensation, the error that killed the task.
    pub fn cause(&self) -> Option<&str> {
        self.cause.as_deref()
    }

    /// Cancelled when the runtime stops this attempt: timeout, lost lease, shutdown, or
    /// an operator's cancel of the running task. Long handlers should watch it and
    /// return early; after a cancel request, a handler that returns an error ends the
    /// task `cancelled`, one that ignores the request is stopped at its timeout.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancellation
    }

    /// Record that the handler's transaction, which also marked this task succeeded
    /// under its lease epoch, has committed: the worker then writes no outcome of its
    /// own. Called by the backends' transactional completion (for example
    /// `tenax::storage::postgres::Transactional`) right after its commit returned;
    /// an ordinary command never calls it (its task would stay `running` until its
    /// lease expired, and then run again).
    pub fn record_completion_committed(&self) {
        self.completed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether [`record_completion_committed`](Self::record_completion_committed) was
    /// called for this attempt.
    pub fn completion_committed(&self) -> bool {
        self.completed.load(std::sync::atomic::Ordering::SeqCst)
    }
}
