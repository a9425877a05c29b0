//! Tenax domain types: commands, tasks, the state machine and retry policies.
//!
//! This crate performs no I/O. It is shared by the storage backends, the runtime and
//! the CLI, and it is what a command author implements against:
//!
//! - [`Command`]: one background job type (the command pattern). Only
//!   [`Command::execute`] is required; compensation, retry policy, attempts, timeout,
//!   queue and priority all have documented defaults.
//! - [`BatchCommand`]: a job type whose tasks run many at a time in one call, each
//!   with its own outcome.
//! - [`CommandError`]: the error a handler returns, carrying the retry decision.
//! - [`TaskStatus`] and [`state`]: the life cycle and its table of legal transitions.
//! - [`RetryPolicy`]: exponential backoff with jitter, capped.
//! - [`Registry`]: maps stable type names to handler instances.
//! - [`Schedule`] and [`schedule`]: periodic tasks (cron expressions and intervals).
#![forbid(unsafe_code)]

mod batch;
mod command;
mod error;
mod hook;
pub mod outbound;
mod parents;
mod registry;
pub mod retry;
pub mod schedule;
pub mod secrets;
pub mod state;
mod task;

pub use batch::{BatchCommand, BatchItem, Batched, DynBatchHandler, RawItem, MAX_BATCH_LIMIT};
pub use command::{Command, TaskContext};
pub use error::{CommandError, ResultExt};
pub use hook::{ExecutionHook, ExecutionOutcome, HookFuture};
pub use parents::{ParentResult, ParentSource, Parents, ParentsFuture};
pub use registry::{defaults_of, CommandDefaults, DynHandler, Registry, RegistryError};
pub use retry::{Backoff, BackoffFn, Jitter, LoadAware, RetryPolicy};
pub use schedule::{Cadence, MissedTicks, Schedule, ScheduleDef};
pub use secrets::{Masker, Secrets};
pub use state::{TaskStatus, Transition};
pub use task::{
    validate_command_type, AttemptOutcome, AttemptRecord, CompensationState, InvalidInput,
    Priority, QueueName, TaskId, TaskKind, TaskNo, TaskRecord, PRIORITY_AGING_STEP,
};
