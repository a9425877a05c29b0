//! Tenax: a durable task scheduler built on the command pattern.
//!
//! Every task is stored before it runs, run by workers under a lease, retried with
//! exponential backoff and jitter, compensated when it finally dies, and picked up
//! again after any crash. SQLite is the embedded default.
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use tenax::{Client, Command, CommandError, Registry, TaskContext, Worker, WorkerConfig};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OpenAccount { customer: String }
//!
//! struct OpenBankAccount;
//!
//! impl Command for OpenBankAccount {
//!     const TYPE: &'static str = "BANK_OPEN_ACCOUNT";
//!     type Context = OpenAccount;
//!     type Output = String;
//!
//!     async fn execute(&self, ctx: OpenAccount, task: &TaskContext) -> Result<String, CommandError> {
//!         Ok(format!("opened for {} (key {})", ctx.customer, task.idempotency_key()))
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("sqlite://tenax.db").await?;
//! client
//!     .enqueue::<OpenBankAccount>(OpenAccount { customer: "ada".into() })
//!     .task_no("ACC-1")
//!     .await?;
//!
//! let mut registry = Registry::new();
//! registry.register(OpenBankAccount)?;
//! let worker = Worker::new(client.storage().clone(), registry, WorkerConfig::default())?;
//! worker.run(tokio_util::sync::CancellationToken::new()).await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub use tenax_core::{
    defaults_of, validate_command_type, AttemptOutcome, AttemptRecord, Backoff, BatchCommand,
    BatchItem, Batched, Command, CommandDefaults, CommandError, CompensationState, ExecutionHook,
    ExecutionOutcome, HookFuture, InvalidInput, Jitter, LoadAware, ParentResult, Priority,
    QueueName, Registry, RegistryError, ResultExt, RetryPolicy, Secrets, TaskContext, TaskId,
    TaskKind, TaskNo, TaskRecord, TaskStatus,
};
pub use tenax_core::{schedule, Cadence, MissedTicks, Schedule, ScheduleDef};
pub use tenax_runtime::{
    BackgroundQueue, Client, ConfigError, Enqueue, Error, OffPeak, Service, Tz, Worker,
    WorkerConfig, Workflow,
};

/// Every outbound delivery, run beside a worker with [`Worker::with_service`]:
/// completion callbacks, death and backlog alerts, and the event sequencer with its
/// relays (feature `deliveries`; `nats` and `rabbitmq` add the relays).
#[cfg(feature = "deliveries")]
pub use tenax_delivery::Deliveries;

/// Outbound delivery (crate `tenax-delivery`): completion callbacks, death and backlog
/// alerts, the event sequencer and its relays, and their settings
/// ([`delivery::CallbacksConfig`], [`delivery::AlertsConfig`],
/// [`delivery::events::EventsConfig`]); feature `deliveries`.
#[cfg(feature = "deliveries")]
pub mod delivery {
    pub use tenax_delivery::*;
}

/// The built-in `http` and `exec` kinds (crate `tenax-kinds`). Everything of
/// [`delivery`] is here as well, so that paths such as `tenax::kinds::CallbacksConfig`
/// and `tenax::kinds::events::EventsConfig` keep working; feature `deliveries`.
#[cfg(feature = "deliveries")]
pub mod kinds {
    pub use tenax_delivery::*;
    pub use tenax_kinds::*;

    /// The settings of the kinds (`[http]`, `[exec]`) and of delivery (`[callbacks]`,
    /// `[alerts]`), with the [`ConfigError`] they report.
    pub mod config {
        pub use tenax_delivery::config::*;
        pub use tenax_kinds::config::*;
    }
}
pub use tenax_storage::{
    TaskInsertOutcome, WorkflowDetail, WorkflowId, WorkflowPolicy, WorkflowRecord, WorkflowState,
};

/// Metrics: the catalogue, the storage wrapper, the database sampler and (feature
/// `prometheus`) the exporter's configuration.
pub mod metrics {
    pub use tenax_runtime::metrics::*;
}

/// The sqlx version Tenax uses: open the transactions given to the backends'
/// `enqueue_in` functions (`tenax::storage::postgres::enqueue_in`, and the same in
/// `sqlite` and `mysql`) with it, so the types match.
pub use tenax_storage::sqlx;

/// The storage seam and its backends (internal interface; may change in any release).
pub mod storage {
    pub use tenax_storage::*;
}

/// SQLite: transactional completion (a command's database work committed with its
/// task's success) and the storage it runs on.
#[cfg(feature = "sqlite")]
pub mod sqlite {
    pub use tenax_storage::sqlite::{SqliteStorage, Transactional, TransactionalCommand};
}

/// PostgreSQL: transactional completion (a command's database work committed with its
/// task's success) and the storage it runs on.
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use tenax_storage::postgres::{PgStorage, Transactional, TransactionalCommand};
}

/// MariaDB/MySQL: transactional completion (a command's database work committed with
/// its task's success) and the storage it runs on.
#[cfg(feature = "mysql")]
pub mod mysql {
    pub use tenax_storage::mysql::{MySqlStorage, Transactional, TransactionalCommand};
}

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
