//! The registry: stable type names to handler instances (the seed's CommandFactory).
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

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
    /// The backoff policy.
    fn retry_policy(&self) -> RetryPolicy;
    /// Decode the payload and execute; the result is JSON text.
    fn execute(
        self: Arc<Self>,
        payload: String,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<String, CommandError>>;
    /// Decode the payload and compensate.
    fn compensate(
        self: Arc<Self>,
        payload: String,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<(), CommandError>>;
}

struct Erased<C>(C);

fn decode<C: Command>(payload: &str) -> Result<C::Context, CommandError> {
    serde_json::from_str(payload).map_err(|e| {
        CommandError::permanent(format!(
            "payload does not decode as the context of {}: {e}",
            C::TYPE
        ))
    })
}

impl<C: Command> DynHandler for Erased<C> {
    fn command_type(&self) -> &'static str {
        C::TYPE
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.0.retry_policy()
    }

    fn execute(
        self: Arc<Self>,
        payload: String,
        task: TaskContext,
    ) -> BoxFuture<'static, Result<String, CommandError>> {
        async move {
            let ctx = decode::<C>(&payload)?;
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
        task: TaskContext,
    ) -> BoxFuture<'static, Result<(), CommandError>> {
        async move {
            let ctx = decode::<C>(&payload)?;
            self.0.compensate(ctx, &task).await
        }
        .boxed()
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
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<&'static str, Arc<dyn DynHandler>>,
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
        if self.handlers.contains_key(C::TYPE) {
            return Err(RegistryError::Duplicate(C::TYPE.to_owned()));
        }
        self.handlers.insert(C::TYPE, Arc::new(Erased(command)));
        Ok(self)
    }

    /// The handler for a type name.
    pub fn get(&self, command_type: &str) -> Option<Arc<dyn DynHandler>> {
        self.handlers.get(command_type).cloned()
    }

    /// The registered type names, sorted.
    pub fn command_types(&self) -> Vec<String> {
        self.handlers.keys().map(|k| (*k).to_owned()).collect()
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
