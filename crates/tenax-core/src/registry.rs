//! The registry: stable type names to handler instances (the seed's CommandFactory).
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use crate::batch::{BatchCommand, Batched, DynBatchHandler, ErasedBatch, MAX_BATCH_LIMIT};
use crate::command::{Command, TaskContext};
use crate::error::CommandError;
use crate::retry::RetryPolicy;
use crate::task::{validate_command_type, InvalidInput};

/// A registration that cannot be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Two handlers for one type name.
    #[error("command type {0:?} is registered twice")]
    Duplicate(String),
    /// A setting names a type with no handler.
    #[error("command type {0:?} is not registered")]
    Unknown(String),
    /// The type name or a default is invalid.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
}

/// A command with its types erased, as the worker runs it.
///
/// Implemented for every [`Command`] by the registry; not meant to be implemented
/// directly.
pub trait DynHandler: Send + Sync + 'static {
    /// The stable type name.
    fn command_type(&self) -> &'static str;
    /// The context's shape version ([`Command::VERSION`]): the highest stored payload
    /// version this handler decodes.
    fn version(&self) -> u32;
    /// The backoff policy.
    fn retry_policy(&self) -> RetryPolicy;
    /// Decode the payload, stored under payload version `version` (upcast first when
    /// it is older than [`version`](DynHandler::version)), and execute; the result is
    /// JSON text.
    fn execute(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<String, CommandError>>;
    /// Decode the payload as for [`execute`](DynHandler::execute), and compensate.
    fn compensate(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<(), CommandError>>;
}

struct Erased<C>(C);

/// Decode a payload stored under payload version `stored` as the context of `C`.
///
/// - `stored == C::VERSION`: parsed directly.
/// - `stored < C::VERSION`: parsed as JSON, passed through [`Command::upcast`] (whose
///   error is returned as is), then decoded.
/// - `stored > C::VERSION`: a permanent error. The claim only hands a worker payloads
///   of versions it knows, so this means a caller bypassed that filter.
pub(crate) fn decode<C: Command>(payload: &str, stored: u32) -> Result<C::Context, CommandError> {
    let undecodable = |e: serde_json::Error| {
        CommandError::permanent(format!(
            "payload does not decode as the context of {} (stored version {stored}, \
             handler version {}): {e}",
            C::TYPE,
            C::VERSION
        ))
    };
    match stored.cmp(&C::VERSION) {
        Ordering::Equal => serde_json::from_str(payload).map_err(undecodable),
        Ordering::Less => {
            let value: serde_json::Value = serde_json::from_str(payload).map_err(undecodable)?;
            let current = C::upcast(stored, value)?;
            serde_json::from_value(current).map_err(|e| {
                CommandError::permanent(format!(
                    "payload does not decode as the context of {} after its upcast from \
                     version {stored} to version {}: {e}",
                    C::TYPE,
                    C::VERSION
                ))
            })
        }
        Ordering::Greater => Err(CommandError::permanent(format!(
            "payload version {stored} is newer than version {} of {}, which this worker runs; \
             the claim should have left the task to a worker that knows version {stored}",
            C::VERSION,
            C::TYPE
        ))),
    }
}

impl<C: Command> DynHandler for Erased<C> {
    fn command_type(&self) -> &'static str {
        C::TYPE
    }

    fn version(&self) -> u32 {
        C::VERSION
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.0.retry_policy()
    }

    fn execute(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<String, CommandError>> {
        async move {
            let ctx = decode::<C>(&payload, version)?;
            let output = self.0.execute(ctx, &task).await?;
            serde_json::to_string(&output).map_err(|e| {
                CommandError::permanent(format!("result does not encode as JSON: {e}"))
            })
        }
        .boxed()
    }

    fn compensate(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<(), CommandError>> {
        async move {
            let ctx = decode::<C>(&payload, version)?;
            self.0.compensate(ctx, &task).await
        }
        .boxed()
    }
}

/// A handler whose retry policy was set by [`Registry::set_retry_policy`]: everything
/// else is the wrapped handler's.
struct WithPolicy {
    inner: Arc<dyn DynHandler>,
    policy: RetryPolicy,
}

impl DynHandler for WithPolicy {
    fn command_type(&self) -> &'static str {
        self.inner.command_type()
    }

    fn version(&self) -> u32 {
        self.inner.version()
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.policy.clone()
    }

    fn execute(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<String, CommandError>> {
        self.inner.clone().execute(payload, version, task)
    }

    fn compensate(
        self: Arc<Self>,
        payload: String,
        version: u32,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<(), CommandError>> {
        self.inner.clone().compensate(payload, version, task)
    }
}

/// Defaults a command declares for the tasks enqueued for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandDefaults {
    /// Queue.
    pub queue: &'static str,
    /// Priority.
    pub priority: u8,
    /// Attempt budget.
    pub max_attempts: u32,
    /// Per-attempt timeout.
    pub timeout: Duration,
}

impl CommandDefaults {
    /// The one table of defaults. A task gets these unless its command declares others
    /// (a [`Command`]'s constants default to them) or its enqueue sets them, by every
    /// way in: the library (`enqueue_raw` included), the HTTP API, the CLI and
    /// schedules. The per-attempt timeout is 30 minutes: long enough for real work,
    /// short enough that a hung handler does not hold its slot for hours.
    pub const STANDARD: CommandDefaults = CommandDefaults {
        queue: crate::QueueName::DEFAULT,
        priority: crate::Priority::DEFAULT.get(),
        max_attempts: 5,
        timeout: Duration::from_secs(30 * 60),
    };
}

impl Default for CommandDefaults {
    fn default() -> Self {
        Self::STANDARD
    }
}

/// Maps command type names to handler instances.
///
/// ```
/// # use tenax_core::{Command, CommandError, Registry, TaskContext};
/// # struct Ping;
/// # impl Command for Ping {
/// #     const TYPE: &'static str = "PING";
/// #     type Context = ();
/// #     type Output = ();
/// #     async fn execute(&self, _: (), _: &TaskContext) -> Result<(), CommandError> { Ok(()) }
/// # }
/// let mut registry = Registry::new();
/// registry.register(Ping).unwrap();
/// assert!(registry.register(Ping).is_err()); // one handler per type
/// assert_eq!(registry.command_types(), vec!["PING".to_string()]);
/// assert_eq!(registry.commands(), vec![("PING".to_string(), 1)]); // Command::VERSION
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<&'static str, Arc<dyn DynHandler>>,
    /// The batch commands among the handlers.
    batches: BTreeMap<&'static str, Arc<dyn DynBatchHandler>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Register a handler instance for `C::TYPE`.
    pub fn register<C: Command>(&mut self, command: C) -> Result<&mut Self, RegistryError> {
        validate_command_type(C::TYPE)?;
        crate::task::Priority::new(C::PRIORITY)?;
        crate::task::QueueName::new(C::QUEUE)?;
        if C::MAX_ATTEMPTS == 0 {
            return Err(InvalidInput::new("max attempts", "must be at least 1").into());
        }
        if C::VERSION == 0 {
            return Err(InvalidInput::new("payload version", "must be at least 1").into());
        }
        if self.handlers.contains_key(C::TYPE) {
            return Err(RegistryError::Duplicate(C::TYPE.to_owned()));
        }
        self.handlers.insert(C::TYPE, Arc::new(Erased(command)));
        Ok(self)
    }

    /// Register a batch command for `C::TYPE`: its tasks are claimed and run in
    /// batches (see [`BatchCommand`]); a compensation runs for each task on its own.
    pub fn register_batch<C: BatchCommand>(
        &mut self,
        command: C,
    ) -> Result<&mut Self, RegistryError> {
        if C::MAX_BATCH == 0 || C::MAX_BATCH > MAX_BATCH_LIMIT {
            return Err(
                InvalidInput::new("max batch", format!("must be 1..={MAX_BATCH_LIMIT}")).into(),
            );
        }
        if C::CONCURRENCY == 0 {
            return Err(InvalidInput::new("batch concurrency", "must be at least 1").into());
        }
        let batched = Batched::new(command);
        let shared = batched.inner().clone();
        self.register(batched)?;
        self.batches.insert(C::TYPE, Arc::new(ErasedBatch(shared)));
        Ok(self)
    }

    /// Retry the tasks of `command_type` with `policy` instead of the policy its
    /// command declares ([`Command::retry_policy`]): how a deployment tunes a handler's
    /// backoff from its configuration (`[retry."TYPE"]` in `tenax.toml`) without
    /// changing its code. The attempt budget is the task's own, set at enqueue.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tenax_core::{Command, CommandError, Registry, RetryPolicy, TaskContext};
    /// # struct Ping;
    /// # impl Command for Ping {
    /// #     const TYPE: &'static str = "PING";
    /// #     type Context = ();
    /// #     type Output = ();
    /// #     async fn execute(&self, _: (), _: &TaskContext) -> Result<(), CommandError> { Ok(()) }
    /// # }
    /// let mut registry = Registry::new();
    /// registry.register(Ping).unwrap();
    /// registry.set_retry_policy("PING", RetryPolicy::fixed(Duration::from_secs(2))).unwrap();
    /// let ping = registry.get("PING").unwrap();
    /// assert_eq!(ping.retry_policy().ceiling(7), Duration::from_secs(2));
    /// assert!(registry.set_retry_policy("PONG", RetryPolicy::default()).is_err());
    /// ```
    pub fn set_retry_policy(
        &mut self,
        command_type: &str,
        policy: RetryPolicy,
    ) -> Result<&mut Self, RegistryError> {
        let Some((name, handler)) = self.handlers.get_key_value(command_type) else {
            return Err(RegistryError::Unknown(command_type.to_owned()));
        };
        // Set twice, the outer wrapper answers: the last policy wins.
        let (name, inner) = (*name, handler.clone());
        let wrapped = WithPolicy {
            inner,
            policy: policy.clone(),
        };
        self.handlers.insert(name, Arc::new(wrapped));
        if let Some(batch) = self.batches.get(name).cloned() {
            let wrapped = crate::batch::BatchWithPolicy::new(batch, policy);
            self.batches.insert(name, Arc::new(wrapped));
        }
        Ok(self)
    }

    /// The batch commands, by type name.
    pub fn batch_handlers(&self) -> Vec<Arc<dyn DynBatchHandler>> {
        self.batches.values().cloned().collect()
    }

    /// The registered type names run one task at a time, with the payload version
    /// each decodes, sorted by name (the batch commands left out).
    pub fn single_commands(&self) -> Vec<(String, u32)> {
        self.handlers
            .iter()
            .filter(|(name, _)| !self.batches.contains_key(*name))
            .map(|(name, handler)| ((*name).to_owned(), handler.version()))
            .collect()
    }

    /// The handler for a type name.
    pub fn get(&self, command_type: &str) -> Option<Arc<dyn DynHandler>> {
        self.handlers.get(command_type).cloned()
    }

    /// The registered type names, sorted.
    pub fn command_types(&self) -> Vec<String> {
        self.handlers.keys().map(|k| (*k).to_owned()).collect()
    }

    /// The registered type names with the payload version each decodes
    /// ([`Command::VERSION`]), sorted by name: what a worker offers when it claims.
    pub fn commands(&self) -> Vec<(String, u32)> {
        self.handlers
            .iter()
            .map(|(name, handler)| ((*name).to_owned(), handler.version()))
            .collect()
    }

    /// Whether no command is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

/// The enqueue defaults a command declares.
pub fn defaults_of<C: Command>() -> CommandDefaults {
    CommandDefaults {
        queue: C::QUEUE,
        priority: C::PRIORITY,
        max_attempts: C::MAX_ATTEMPTS,
        timeout: C::TIMEOUT,
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use serde_json::{json, Value};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::task::{TaskId, TaskKind, TaskNo};

    #[derive(Debug, Serialize, Deserialize)]
    struct Name {
        first: String,
        last: String,
    }

    /// Version 2 of a command whose version 1 stored `{"name": "First Last"}`.
    struct Greet;

    impl Command for Greet {
        const TYPE: &'static str = "GREET";
        const VERSION: u32 = 2;
        type Context = Name;
        type Output = String;

        async fn execute(&self, ctx: Name, _: &TaskContext) -> Result<String, CommandError> {
            Ok(format!("{}/{}", ctx.first, ctx.last))
        }

        fn upcast(version: u32, payload: Value) -> Result<Value, CommandError> {
            match (version, payload["name"].as_str()) {
                (1, Some(name)) => {
                    let (first, last) = name.split_once(' ').unwrap_or((name, ""));
                    Ok(json!({ "first": first, "last": last }))
                }
                _ => Err(CommandError::permanent(format!(
                    "cannot upcast version {version}"
                ))),
            }
        }
    }

    fn context() -> TaskContext {
        TaskContext::new(
            TaskId(1),
            TaskNo::new("T").unwrap(),
            TaskKind::Execute,
            1,
            1,
            1,
            "T".into(),
            None,
            CancellationToken::new(),
        )
    }

    async fn run(payload: &str, version: u32) -> Result<String, CommandError> {
        let mut registry = Registry::new();
        registry.register(Greet).unwrap();
        let handler = registry.get("GREET").unwrap();
        assert_eq!(handler.version(), 2);
        handler.execute(payload.into(), version, context()).await
    }

    #[tokio::test]
    async fn the_current_version_decodes_directly() {
        let out = run(r#"{"first":"Ada","last":"Lovelace"}"#, 2)
            .await
            .unwrap();
        assert_eq!(out, r#""Ada/Lovelace""#);
    }

    #[tokio::test]
    async fn an_older_version_is_upcast_before_decoding() {
        let out = run(r#"{"name":"Ada Lovelace"}"#, 1).await.unwrap();
        assert_eq!(out, r#""Ada/Lovelace""#);
        // Without the upcast, the v1 payload does not decode as v2.
        let err = run(r#"{"name":"Ada Lovelace"}"#, 2).await.unwrap_err();
        assert!(matches!(err, CommandError::Permanent(_)), "{err}");
        assert!(
            err.to_string()
                .contains("payload does not decode as the context of GREET"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_upcast_error_is_returned_as_is() {
        let err = run(r#"{"nom":"Ada"}"#, 1).await.unwrap_err();
        assert_eq!(err, CommandError::permanent("cannot upcast version 1"));
    }

    #[tokio::test]
    async fn a_newer_version_is_refused_permanently() {
        let err = run(r#"{"first":"Ada","last":"Lovelace"}"#, 3)
            .await
            .unwrap_err();
        assert!(matches!(err, CommandError::Permanent(_)), "{err}");
        assert!(err.to_string().contains("newer"), "{err}");
    }

    #[test]
    fn version_0_is_refused() {
        struct Zero;
        impl Command for Zero {
            const TYPE: &'static str = "ZERO";
            const VERSION: u32 = 0;
            type Context = ();
            type Output = ();
            async fn execute(&self, _: (), _: &TaskContext) -> Result<(), CommandError> {
                Ok(())
            }
        }
        let err = Registry::new().register(Zero).unwrap_err();
        assert!(err.to_string().contains("payload version"), "{err}");
    }

    #[test]
    fn the_registry_offers_each_type_with_its_version() {
        let mut registry = Registry::new();
        registry.register(Greet).unwrap();
        assert_eq!(registry.commands(), vec![("GREET".to_owned(), 2)]);
    }
}
