//! Batch commands: one call runs many tasks of a type, each with its own outcome.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::command::{Command, TaskContext};
use crate::error::CommandError;
use crate::registry::decode;
use crate::retry::RetryPolicy;
use crate::task::QueueName;

/// Most tasks one batch may hold ([`BatchCommand::MAX_BATCH`]).
pub const MAX_BATCH_LIMIT: u32 = 1000;

/// One task of a batch: its decoded context and what the handler knows about it.
#[derive(Debug)]
pub struct BatchItem<C> {
    /// The task's context.
    pub context: C,
    /// The task's attempt, lease and keys; its [`TaskContext::cancellation`] is
    /// signalled when a cancel of this task is requested while the batch runs.
    pub task: TaskContext,
}

/// A kind of background job whose tasks run many at a time, in one call: a worker
/// claims up to [`MAX_BATCH`](BatchCommand::MAX_BATCH) due tasks of the type together
/// and hands them to [`execute_batch`](BatchCommand::execute_batch), which answers for
/// each task.
///
/// Each task stays a task of its own: it has its own attempts, backoff, dead state and
/// compensation, its own lease (renewed with the others by the worker's heartbeat), and
/// its outcome is written with a write fenced by its own lease epoch. The successes of
/// a batch are written in one statement.
///
/// When fewer than `MAX_BATCH` tasks are due, the worker waits up to
/// [`MAX_WAIT`](BatchCommand::MAX_WAIT) after the oldest due one became due for more to
/// arrive, holding no lease meanwhile. With a [`batch_key`](BatchCommand::batch_key),
/// a batch only ever holds tasks with the same key (the tasks claimed together are
/// split by key, and each key's share is a batch of its own).
///
/// Register it with [`Registry::register_batch`](crate::Registry::register_batch) and
/// enqueue its tasks as [`Batched<C>`] (`client.enqueue::<Batched<C>>(ctx)`).
///
/// ```
/// use std::time::Duration;
/// use serde::{Deserialize, Serialize};
/// use tenax_core::{BatchCommand, BatchItem, CommandError};
///
/// #[derive(Serialize, Deserialize)]
/// struct Notice { partner: String, to: String }
///
/// struct SendNotices; // would hold the gateway's client
///
/// impl BatchCommand for SendNotices {
///     const TYPE: &'static str = "SEND_NOTICES";
///     const MAX_BATCH: u32 = 200;
///     const MAX_WAIT: Duration = Duration::from_millis(500);
///     type Context = Notice;
///     type Output = ();
///
///     fn batch_key(&self, notice: &Notice) -> Option<String> {
///         Some(notice.partner.clone()) // one gateway call per partner
///     }
///
///     async fn execute_batch(&self, items: Vec<BatchItem<Notice>>) -> Vec<Result<(), CommandError>> {
///         // One call to the gateway; its answer is per recipient.
///         items.iter().map(|item| if item.context.to.is_empty() {
///             Err(CommandError::permanent("no recipient"))
///         } else {
///             Ok(())
///         }).collect()
///     }
/// }
/// ```
pub trait BatchCommand: Send + Sync + 'static {
    /// The stable type name stored with each task.
    const TYPE: &'static str;
    /// Most tasks in one batch, 1..=[`MAX_BATCH_LIMIT`]. Defaults to 100.
    const MAX_BATCH: u32 = 100;
    /// How long a batch may wait to fill, counted from when the oldest due task of the
    /// type became due. Defaults to 1 second.
    const MAX_WAIT: Duration = Duration::from_secs(1);
    /// Batches of this type one worker runs at once. Defaults to 1.
    const CONCURRENCY: u32 = 1;
    /// Attempts of each task before it is dead. Defaults to 5.
    const MAX_ATTEMPTS: u32 = crate::CommandDefaults::STANDARD.max_attempts;
    /// Time allowed for one task's attempt; a batch runs under the shortest timeout of
    /// its tasks. Defaults to 30 minutes.
    const TIMEOUT: Duration = crate::CommandDefaults::STANDARD.timeout;
    /// The queue tasks of this command go to. Defaults to `"default"`.
    const QUEUE: &'static str = QueueName::DEFAULT;
    /// Priority 0-9 (9 most urgent). Defaults to 5.
    const PRIORITY: u8 = crate::task::Priority::DEFAULT.get();
    /// The shape version of the context, as [`Command::VERSION`]. Defaults to 1.
    const VERSION: u32 = 1;

    /// The typed context of one task, stored as JSON.
    type Context: Serialize + DeserializeOwned + Send + 'static;
    /// What one task's success returns, stored as JSON as its result.
    type Output: Serialize + Send + 'static;

    /// Run a batch: `items` holds at most [`MAX_BATCH`](BatchCommand::MAX_BATCH) tasks
    /// (all with the same [`batch_key`](BatchCommand::batch_key)). Return one outcome
    /// per item, in item order; the error's variant is each task's retry decision. A
    /// missing outcome counts as a retryable error of its task.
    fn execute_batch(
        &self,
        items: Vec<BatchItem<Self::Context>>,
    ) -> impl Future<Output = Vec<Result<Self::Output, CommandError>>> + Send;

    /// The key tasks must share to run in one batch (for example the partner bank), or
    /// `None`, the default: any tasks of the type may run together.
    fn batch_key(&self, ctx: &Self::Context) -> Option<String> {
        let _ = ctx;
        None
    }

    /// Undo what the command did for one task, once that task is dead; as
    /// [`Command::compensate`], it runs for each task on its own. Defaults to no
    /// compensation.
    fn compensate(
        &self,
        ctx: Self::Context,
        task: &TaskContext,
    ) -> impl Future<Output = Result<(), CommandError>> + Send {
        let _ = (ctx, task);
        async { Err(CommandError::NoCompensation) }
    }

    /// Turn an older stored payload into the current shape, as [`Command::upcast`].
    fn upcast(version: u32, payload: serde_json::Value) -> Result<serde_json::Value, CommandError> {
        let _ = version;
        Ok(payload)
    }

    /// Backoff between each task's attempts. Defaults to [`RetryPolicy::default`].
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }
}

/// A [`BatchCommand`] seen as a [`Command`]: the type to enqueue its tasks with
/// (`client.enqueue::<Batched<C>>(ctx)`), and what runs a task on its own (a
/// compensation, or a batch of one).
pub struct Batched<C>(Arc<C>);

impl<C> Batched<C> {
    /// Wrap a batch command.
    pub fn new(command: C) -> Self {
        Self(Arc::new(command))
    }

    pub(crate) fn inner(&self) -> &Arc<C> {
        &self.0
    }
}

impl<C: BatchCommand> Command for Batched<C> {
    const TYPE: &'static str = C::TYPE;
    const MAX_ATTEMPTS: u32 = C::MAX_ATTEMPTS;
    const TIMEOUT: Duration = C::TIMEOUT;
    const QUEUE: &'static str = C::QUEUE;
    const PRIORITY: u8 = C::PRIORITY;
    const VERSION: u32 = C::VERSION;
    type Context = C::Context;
    type Output = C::Output;

    async fn execute(
        &self,
        ctx: Self::Context,
        task: &TaskContext,
    ) -> Result<Self::Output, CommandError> {
        let item = BatchItem {
            context: ctx,
            task: task.clone(),
        };
        let mut outcomes = self.0.execute_batch(vec![item]).await;
        if outcomes.len() > 1 {
            return Err(CommandError::retryable(format!(
                "the batch handler returned {} outcomes for 1 task",
                outcomes.len()
            )));
        }
        outcomes.pop().unwrap_or_else(|| Err(missing_outcome(0, 1)))
    }

    async fn compensate(&self, ctx: Self::Context, task: &TaskContext) -> Result<(), CommandError> {
        self.0.compensate(ctx, task).await
    }

    fn upcast(version: u32, payload: serde_json::Value) -> Result<serde_json::Value, CommandError> {
        C::upcast(version, payload)
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.0.retry_policy()
    }
}

fn missing_outcome(index: usize, len: usize) -> CommandError {
    CommandError::retryable(format!(
        "the batch handler returned no outcome for item {} of {len}",
        index + 1
    ))
}

/// One stored task handed to a [`DynBatchHandler`]: its payload, the payload's stored
/// version and its context.
#[derive(Debug, Clone)]
pub struct RawItem {
    /// Payload, JSON text.
    pub payload: String,
    /// Stored payload version.
    pub version: u32,
    /// The task's context.
    pub task: TaskContext,
}

/// A batch command with its types erased, as the worker runs it.
///
/// Implemented for every [`BatchCommand`] by the registry; not meant to be implemented
/// directly.
pub trait DynBatchHandler: Send + Sync + 'static {
    /// The stable type name.
    fn command_type(&self) -> &'static str;
    /// The context's shape version.
    fn version(&self) -> u32;
    /// Most tasks per batch.
    fn max_batch(&self) -> u32;
    /// Longest wait to fill a batch.
    fn max_wait(&self) -> Duration;
    /// Batches one worker runs at once.
    fn concurrency(&self) -> u32;
    /// The backoff policy.
    fn retry_policy(&self) -> RetryPolicy;
    /// The batch key of a stored payload; an error when it does not decode.
    fn batch_key(&self, payload: &str, version: u32) -> Result<Option<String>, CommandError>;
    /// Decode each payload and run the batch; one outcome (the result as JSON text) per
    /// item, in order, whatever the handler returned. An item whose payload does not
    /// decode fails permanently and is left out of the handler's call; more outcomes
    /// than items fail every item (retryable), a missing one fails its item (retryable).
    fn execute_batch(
        self: Arc<Self>,
        items: Vec<RawItem>,
    ) -> BoxFuture<'static, Vec<Result<String, CommandError>>>;
}

/// A batch handler whose retry policy was set by
/// [`Registry::set_retry_policy`](crate::Registry::set_retry_policy).
pub(crate) struct BatchWithPolicy {
    inner: Arc<dyn DynBatchHandler>,
    policy: RetryPolicy,
}

impl BatchWithPolicy {
    pub(crate) fn new(inner: Arc<dyn DynBatchHandler>, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }
}

impl DynBatchHandler for BatchWithPolicy {
    fn command_type(&self) -> &'static str {
        self.inner.command_type()
    }

    fn version(&self) -> u32 {
        self.inner.version()
    }

    fn max_batch(&self) -> u32 {
        self.inner.max_batch()
    }

    fn max_wait(&self) -> Duration {
        self.inner.max_wait()
    }

    fn concurrency(&self) -> u32 {
        self.inner.concurrency()
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.policy.clone()
    }

    fn batch_key(&self, payload: &str, version: u32) -> Result<Option<String>, CommandError> {
        self.inner.batch_key(payload, version)
    }

    fn execute_batch(
        self: Arc<Self>,
        items: Vec<RawItem>,
    ) -> BoxFuture<'static, Vec<Result<String, CommandError>>> {
        self.inner.clone().execute_batch(items)
    }
}

pub(crate) struct ErasedBatch<C>(pub(crate) Arc<C>);

impl<C: BatchCommand> DynBatchHandler for ErasedBatch<C> {
    fn command_type(&self) -> &'static str {
        C::TYPE
    }

    fn version(&self) -> u32 {
        C::VERSION
    }

    fn max_batch(&self) -> u32 {
        C::MAX_BATCH
    }

    fn max_wait(&self) -> Duration {
        C::MAX_WAIT
    }

    fn concurrency(&self) -> u32 {
        C::CONCURRENCY
    }

    fn retry_policy(&self) -> RetryPolicy {
        self.0.retry_policy()
    }

    fn batch_key(&self, payload: &str, version: u32) -> Result<Option<String>, CommandError> {
        let ctx = decode::<Batched<C>>(payload, version)?;
        Ok(self.0.batch_key(&ctx))
    }

    fn execute_batch(
        self: Arc<Self>,
        items: Vec<RawItem>,
    ) -> BoxFuture<'static, Vec<Result<String, CommandError>>> {
        async move {
            let len = items.len();
            let mut outcomes: Vec<Option<Result<String, CommandError>>> = Vec::with_capacity(len);
            let mut decoded = Vec::with_capacity(len);
            let mut positions = Vec::with_capacity(len);
            for (i, item) in items.into_iter().enumerate() {
                match decode::<Batched<C>>(&item.payload, item.version) {
                    Ok(context) => {
                        outcomes.push(None);
                        positions.push(i);
                        decoded.push(BatchItem {
                            context,
                            task: item.task,
                        });
                    }
                    Err(e) => outcomes.push(Some(Err(e))),
                }
            }
            let asked = decoded.len();
            let answered = if asked == 0 {
                Vec::new()
            } else {
                self.0.execute_batch(decoded).await
            };
            // More outcomes than items: which outcome is whose is unknown, so none is
            // trusted and every item is retried.
            let answered = if answered.len() > asked {
                let error = CommandError::retryable(format!(
                    "the batch handler returned {} outcomes for {asked} items",
                    answered.len()
                ));
                (0..asked).map(|_| Err(error.clone())).collect()
            } else {
                answered
            };
            let mut answered = answered.into_iter();
            for (n, &i) in positions.iter().enumerate() {
                let outcome = match answered.next() {
                    Some(Ok(output)) => serde_json::to_string(&output).map_err(|e| {
                        CommandError::permanent(format!("result does not encode as JSON: {e}"))
                    }),
                    Some(Err(e)) => Err(e),
                    None => Err(missing_outcome(n, asked)),
                };
                if let Some(slot) = outcomes.get_mut(i) {
                    *slot = Some(outcome);
                }
            }
            outcomes
                .into_iter()
                .map(|o| o.unwrap_or_else(|| Err(missing_outcome(0, len))))
                .collect()
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::registry::Registry;
    use crate::task::{TaskId, TaskKind, TaskNo};

    #[derive(Serialize, Deserialize)]
    struct Item {
        n: u32,
    }

    /// Answers `n * 10` for each item, but only for the first `answer` items; with
    /// `answer` above the item count, repeats the last answer.
    struct Tens {
        answer: usize,
    }

    impl BatchCommand for Tens {
        const TYPE: &'static str = "TENS";
        const MAX_BATCH: u32 = 4;
        type Context = Item;
        type Output = u32;

        fn batch_key(&self, item: &Item) -> Option<String> {
            Some(format!("k{}", item.n % 2))
        }

        async fn execute_batch(
            &self,
            items: Vec<BatchItem<Item>>,
        ) -> Vec<Result<u32, CommandError>> {
            let mut out: Vec<_> = items.iter().map(|i| Ok(i.context.n * 10)).collect();
            out.resize_with(self.answer, || Ok(0));
            out
        }
    }

    fn raw(payload: &str) -> RawItem {
        RawItem {
            payload: payload.to_owned(),
            version: 1,
            task: TaskContext::new(
                TaskId(1),
                TaskNo::new("T").unwrap(),
                TaskKind::Execute,
                1,
                5,
                1,
                "T".into(),
                None,
                CancellationToken::new(),
            ),
        }
    }

    fn handler(answer: usize) -> Arc<dyn DynBatchHandler> {
        let mut registry = Registry::new();
        registry.register_batch(Tens { answer }).unwrap();
        registry.batch_handlers().remove(0)
    }

    #[tokio::test]
    async fn outcomes_are_per_item_in_order_and_undecodable_items_fail_alone() {
        let h = handler(2);
        let out = h
            .execute_batch(vec![raw(r#"{"n":1}"#), raw("not json"), raw(r#"{"n":2}"#)])
            .await;
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], Ok("10".to_owned()));
        assert!(
            matches!(&out[1], Err(CommandError::Permanent(_))),
            "{out:?}"
        );
        assert_eq!(out[2], Ok("20".to_owned()));
    }

    #[tokio::test]
    async fn a_missing_outcome_is_retryable_and_too_many_fail_every_item() {
        let short = handler(1)
            .execute_batch(vec![raw(r#"{"n":1}"#), raw(r#"{"n":2}"#)])
            .await;
        assert_eq!(short[0], Ok("10".to_owned()));
        assert!(
            matches!(&short[1], Err(e) if e.is_retryable() && e.to_string().contains("no outcome for item 2")),
            "{short:?}"
        );
        let long = handler(3)
            .execute_batch(vec![raw(r#"{"n":1}"#), raw(r#"{"n":2}"#)])
            .await;
        assert_eq!(long.len(), 2);
        assert!(
            long.iter().all(|o| matches!(o, Err(e) if e.is_retryable())),
            "{long:?}"
        );
    }

    #[test]
    fn keys_sizes_and_registration() {
        let h = handler(0);
        assert_eq!(h.batch_key(r#"{"n":3}"#, 1), Ok(Some("k1".to_owned())));
        assert!(h.batch_key("[]", 1).is_err());
        assert_eq!((h.max_batch(), h.concurrency()), (4, 1));
        let mut registry = Registry::new();
        registry.register_batch(Tens { answer: 0 }).unwrap();
        // Registered as a command too (enqueue, compensation), but not claimed singly.
        assert!(registry.get("TENS").is_some());
        assert_eq!(registry.commands(), vec![("TENS".to_owned(), 1)]);
        assert!(registry.single_commands().is_empty());
        assert!(registry.register_batch(Tens { answer: 0 }).is_err());

        struct Huge;
        impl BatchCommand for Huge {
            const TYPE: &'static str = "HUGE";
            const MAX_BATCH: u32 = MAX_BATCH_LIMIT + 1;
            type Context = ();
            type Output = ();
            async fn execute_batch(&self, _: Vec<BatchItem<()>>) -> Vec<Result<(), CommandError>> {
                Vec::new()
            }
        }
        let err = Registry::new().register_batch(Huge).unwrap_err();
        assert!(err.to_string().contains("max batch"), "{err}");
    }

    #[tokio::test]
    async fn a_batch_command_runs_alone_as_a_batch_of_one() {
        let mut registry = Registry::new();
        registry.register_batch(Tens { answer: 1 }).unwrap();
        let single = registry.get("TENS").unwrap();
        let out = single.execute(r#"{"n":7}"#.into(), 1, raw("").task).await;
        assert_eq!(out, Ok("70".to_owned()));
        let mut none = Registry::new();
        none.register_batch(Tens { answer: 0 }).unwrap();
        let err = none
            .get("TENS")
            .unwrap()
            .execute(r#"{"n":7}"#.into(), 1, raw("").task)
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err}");
    }

    #[tokio::test]
    async fn a_retry_policy_set_by_configuration_wins_and_the_handler_still_runs() {
        let mut registry = Registry::new();
        registry.register_batch(Tens { answer: 1 }).unwrap();
        let declared = registry.get("TENS").unwrap().retry_policy().ceiling(3);
        let fixed = RetryPolicy::fixed(Duration::from_millis(1500));
        registry.set_retry_policy("TENS", fixed.clone()).unwrap();
        // Set twice: the last one wins.
        registry
            .set_retry_policy("TENS", RetryPolicy::fixed(Duration::from_millis(700)))
            .unwrap();
        let single = registry.get("TENS").unwrap();
        let batch = registry.batch_handlers().remove(0);
        for ceiling in [
            single.retry_policy().ceiling(3),
            batch.retry_policy().ceiling(3),
        ] {
            assert_eq!(ceiling, Duration::from_millis(700));
            assert_ne!(ceiling, declared);
        }
        // Everything else is the command's own.
        assert_eq!((batch.max_batch(), batch.version()), (4, 1));
        assert_eq!(batch.batch_key(r#"{"n":3}"#, 1), Ok(Some("k1".to_owned())));
        let out = single.execute(r#"{"n":7}"#.into(), 1, raw("").task).await;
        assert_eq!(out, Ok("70".to_owned()));
        let items = vec![raw(r#"{"n":2}"#)];
        assert_eq!(batch.execute_batch(items).await, vec![Ok("20".to_owned())]);
        assert_eq!(
            registry.set_retry_policy("NOPE", fixed).unwrap_err(),
            crate::RegistryError::Unknown("NOPE".to_owned())
        );
    }
}
