//! Parts that run beside a worker for as long as it runs: completion callbacks, death
//! and backlog alerts, the event sequencer and its relays (`tenax-kinds` provides
//! them as `Deliveries`), or an application's own.
//!
//! A service is started by [`Worker::run`](crate::Worker::run) after the worker's own
//! background loops, and stopped after the worker's last task has finished and its
//! outcome is committed, so what those last outcomes cause (a callback, an alert) is
//! still sent before `run` returns.
use std::sync::Arc;

use futures::future::BoxFuture;
use tenax_storage::Storage;
use tokio_util::sync::CancellationToken;

/// A background part of a worker process; see the [module](self).
pub trait Service: Send + Sync + 'static {
    /// A short name for the logs.
    fn name(&self) -> &str;

    /// Work on `storage` until `stop` is cancelled, then return. A failure is the
    /// service's to log and retry: nothing it returns stops the worker.
    fn run(
        self: Arc<Self>,
        storage: Arc<dyn Storage>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, ()>;
}
