//! Parts that run beside a worker for as long as it runs: completion callbacks, death
//! and backlog alerts, the event sequencer and its relays (`tenax-delivery` provides
//! them as `Deliveries`), or an application's own.
//!
//! A service is made ready ([`Service::ready`]) before the worker's first claim,
//! started by [`Worker::run`](crate::Worker::run) after the worker's own background
//! loops, and stopped after the worker's last task has finished and its
//! outcome is committed. A delivery sender stops at once then (an attempt under way
//! ends first); what the last outcomes wrote to the outbox is durable, and the next
//! sender of any node delivers it.
use std::sync::Arc;

use futures::future::BoxFuture;
use tenax_storage::Storage;
use tokio_util::sync::CancellationToken;

/// A background part of a worker process: made ready ([`Service::ready`]) before the
/// worker's first claim, started by [`Worker::run`](crate::Worker::run), and stopped
/// after the worker's last outcome is committed.
pub trait Service: Send + Sync + 'static {
    /// A short name for the logs.
    fn name(&self) -> &str;

    /// What must hold before the worker claims its first task (the delivery senders
    /// record themselves, so that a task that dies at once is alerted). Awaited by
    /// [`Worker::run`](crate::Worker::run); the default does nothing. A failure is
    /// the service's to log: the worker starts anyway.
    fn ready(&self, _storage: Arc<dyn Storage>) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    /// Work on `storage` until `stop` is cancelled, then return. A failure is the
    /// service's to log and retry: nothing it returns stops the worker.
    fn run(
        self: Arc<Self>,
        storage: Arc<dyn Storage>,
        stop: CancellationToken,
    ) -> BoxFuture<'static, ()>;
}
