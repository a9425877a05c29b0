//! The Tenax runtime on tokio: the [`Client`] that enqueues and inspects tasks, and the
//! [`Worker`] that claims, runs, retries and compensates them.
//!
//! The path of a task: [`Client::enqueue`] commits it (`pending`); a [`Worker`] that
//! registered its command type claims it (`running`, attempt and lease epoch + 1),
//! runs the handler under a lease kept alive by heartbeats, and writes the outcome
//! with a write guarded by the lease epoch: `succeeded`, `retrying` after backoff, or
//! `dead` with its compensation scheduled as a linked task.
//!
//! Periodic tasks: a [`Schedule`](tenax_core::Schedule) registered with
//! [`Worker::with_schedule`] or stored with [`Client::upsert_schedule`] enqueues one task
//! per tick; every worker's [`scheduler`] fires due ticks through the storage, which
//! makes each tick fire once across all nodes.
#![forbid(unsafe_code)]

mod background;
mod backlog;
mod client;
mod config;
mod error;
pub mod maintenance;
pub mod metrics;
pub mod scheduler;
mod service;
mod timer;
mod worker;
mod workflow;

pub use chrono_tz::Tz;
pub use client::{Client, Enqueue};
pub use config::{BackgroundQueue, ConfigError, OffPeak, WorkerConfig};
pub use error::Error;
pub use service::Service;
pub use worker::Worker;
pub use workflow::Workflow;
