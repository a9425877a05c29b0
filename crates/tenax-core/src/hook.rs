//! Hooks around each execution, for observers such as the test ledger.
use std::future::Future;
use std::pin::Pin;

use crate::command::TaskContext;

/// How one execution ended, as seen by an [`ExecutionHook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionOutcome {
    /// The handler returned success.
    Succeeded,
    /// The handler returned an error (or panicked, or timed out).
    Failed,
    /// The runtime stopped the handler because its lease could not be kept.
    Fenced,
}

impl ExecutionOutcome {
    /// A short name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ExecutionOutcome::Succeeded => "succeeded",
            ExecutionOutcome::Failed => "failed",
            ExecutionOutcome::Fenced => "fenced",
        }
    }
}

/// A boxed future returned by hooks.
pub type HookFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Called by the worker right before a handler starts and right after it ends (before
/// the outcome is written). Must not fail: a hook that cannot record should log.
pub trait ExecutionHook: Send + Sync + 'static {
    /// Before the handler runs.
    fn before<'a>(&'a self, task: &'a TaskContext) -> HookFuture<'a>;
    /// After the handler stopped.
    fn after<'a>(&'a self, task: &'a TaskContext, outcome: ExecutionOutcome) -> HookFuture<'a>;
}
