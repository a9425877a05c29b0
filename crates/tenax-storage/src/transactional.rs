//! Transactional completion: a command's database work and the write that marks its
//! task succeeded commit in one transaction, on the database Tenax uses.
//!
//! Each backend module (`sqlite`, `postgres`, `mysql`) holds the same API, generated
//! here for its transaction type: a `TransactionalCommand` trait whose handler receives
//! `&mut Transaction<'static, DB>`, and the `Transactional` adapter that registers it
//! as an ordinary [`Command`](tenax_core::Command), so the `Command` trait itself stays
//! free of database types.
//!
//! How one attempt runs is documented on each backend's `TransactionalCommand`.

macro_rules! protocol_doc {
    () => {
        "One attempt, inside one transaction:\n\n1. the guarded write: the task's row is written (or, on MariaDB, locked) only if it is\n   still `running` under this attempt's lease epoch. If the lease was lost, the\n   transaction is rolled back before the handler runs and the attempt ends with a\n   retryable error (whose own write, fenced like every outcome, changes nothing);\n2. the handler runs its statements in the same transaction. Meanwhile the row lock\n   (SQLite: the database's single writer lock) keeps every other writer of that task\n   out: no reaper can expire the lease, no other worker can claim the task;\n3. the task is marked succeeded, with its result and attempt history, exactly as an\n   ordinary completion, and the transaction commits.\n\nA handler error rolls everything back (nothing of the attempt stays), and the error\ntakes the ordinary failure path: retried with backoff while attempts remain, else\ndead and compensated. An attempt stopped by its timeout, its self-fence or shutdown\ndrops its transaction uncommitted, which rolls it back. A commit whose answer is lost\n(the connection broke) ends the attempt with a retryable error: if the commit did\nland, the task is already succeeded and the fenced failure write changes nothing; if\nit did not, the task runs again with nothing of the first attempt applied. Either\nway, the handler's effects are applied exactly once per task."
    };
}

/// Generate the transactional completion API of one backend. The invoking module
/// defines `hold(&Storage, Lease)` (begin, then the guarded write; `None` after a
/// rollback when the lease was lost), `finish(&mut Transaction, &TaskCompleteParams)`
/// (complete inside the transaction; `Some(woke)` when it landed); the storage's own
/// `wake()` wakes this process's workers. [`hold_by_write!`] writes the `hold` of a
/// backend whose guarded no-op `UPDATE` reports the rows it matched.
macro_rules! transactional_api {
    ($db:ty, $storage:ty, $backend:literal) => {
        use std::future::Future;
        use std::sync::Arc;
        use std::time::Duration;

        use serde::de::DeserializeOwned;
        use serde::Serialize;
        use sqlx::Transaction;
        use tenax_core::{
            Command, CommandError, CompensationState, Priority, QueueName, RetryPolicy,
            TaskContext,
        };

        use $crate::{Lease, TaskCompleteParams};

        #[doc = concat!(
            "A command whose database work commits in the transaction that marks its task \
             succeeded, on ", $backend, ".\n\n",
            "Register it through [`Transactional`]. The handler gets the open transaction \
             after the guarded write matched: what it writes there commits together with the \
             task's success, or not at all. Every attempt's effects are therefore applied \
             exactly once per task, even when attempts repeat after a crash or a lost lease.\n\n",
            "Keep the transaction short: it holds the task's row lock (on SQLite, the \
             database's single writer lock, which every other writer waits for) until it \
             commits, and the worker's heartbeat, which renews all its leases in one \
             statement, waits for that lock too. Do no network calls inside it. For effects \
             outside this database (a payment provider, an e-mail), use an ordinary \
             [`Command`] with [`TaskContext::idempotency_key`] instead: no transaction can \
             span another system.\n\n",
            $crate::transactional::protocol_doc!()
        )]
        pub trait TransactionalCommand: Send + Sync + 'static {
            /// The stable type name stored with each task ([`Command::TYPE`]).
            const TYPE: &'static str;
            /// Attempts before the task is dead ([`Command::MAX_ATTEMPTS`]).
            const MAX_ATTEMPTS: u32 = tenax_core::CommandDefaults::STANDARD.max_attempts;
            /// Time allowed for one attempt ([`Command::TIMEOUT`]).
            const TIMEOUT: Duration = tenax_core::CommandDefaults::STANDARD.timeout;
            /// The queue ([`Command::QUEUE`]).
            const QUEUE: &'static str = QueueName::DEFAULT;
            /// Priority 0-9 ([`Command::PRIORITY`]).
            const PRIORITY: u8 = Priority::DEFAULT.get();
            /// The context's shape version ([`Command::VERSION`]).
            const VERSION: u32 = 1;

            /// The typed context (payload), stored as JSON.
            type Context: Serialize + DeserializeOwned + Send + 'static;
            /// What a successful run returns, stored as the task's result in the same
            /// transaction.
            type Output: Serialize + Send + 'static;

            /// Run the command's database work in `tx`. `Ok` commits it with the task's
            /// success; an error rolls it back and is the retry decision.
            fn execute_in(
                &self,
                ctx: Self::Context,
                task: &TaskContext,
                tx: &mut Transaction<'static, $db>,
            ) -> impl Future<Output = Result<Self::Output, CommandError>> + Send;

            /// Undo the command in `tx`, committed with the compensation's own success
            /// ([`Command::compensate`]). Defaults to no compensation.
            fn compensate_in(
                &self,
                ctx: Self::Context,
                task: &TaskContext,
                tx: &mut Transaction<'static, $db>,
            ) -> impl Future<Output = Result<(), CommandError>> + Send {
                let _ = (ctx, task, tx);
                async { Err(CommandError::NoCompensation) }
            }

            /// Turn an older payload into the current shape ([`Command::upcast`]).
            fn upcast(
                version: u32,
                payload: serde_json::Value,
            ) -> Result<serde_json::Value, CommandError> {
                let _ = version;
                Ok(payload)
            }

            /// Backoff between attempts ([`Command::retry_policy`]).
            fn retry_policy(&self) -> RetryPolicy {
                RetryPolicy::default()
            }
        }

        #[doc = concat!(
            "Registers a [`TransactionalCommand`] as an ordinary [`Command`] running on ",
            $backend, ": give it the storage the worker uses, and enqueue its tasks as \
             `Transactional<C>`.\n\n",
            "Its handler opens the transaction, makes the guarded write, runs \
             [`TransactionalCommand::execute_in`] (or `compensate_in`), completes the task \
             and commits; the worker then writes nothing more for the attempt."
        )]
        pub struct Transactional<C> {
            command: C,
            storage: Arc<$storage>,
        }

        impl<C> std::fmt::Debug for Transactional<C> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct("Transactional")
                    .field("command", &std::any::type_name::<C>())
                    .finish()
            }
        }

        impl<C: TransactionalCommand> Transactional<C> {
            /// `command`, run in transactions on `storage` (the storage the worker
            /// claims from, so that the completion's wake-ups reach it).
            pub fn new(command: C, storage: Arc<$storage>) -> Self {
                Self { command, storage }
            }

            /// The wrapped command.
            pub fn command(&self) -> &C {
                &self.command
            }
        }

        /// Begin, then make the guarded write; a lost lease is the attempt's error.
        async fn begin_held(
            storage: &$storage,
            lease: Lease,
        ) -> Result<Transaction<'static, $db>, CommandError> {
            match hold(storage, lease).await {
                Ok(Some(tx)) => Ok(tx),
                Ok(None) => Err(CommandError::retryable(
                    "lease lost before the transaction began; nothing was written",
                )),
                Err(e) => Err(CommandError::retryable(format!(
                    "could not open the completion transaction: {e}"
                ))),
            }
        }

        /// Roll back after the handler's error (best effort: a transaction dropped
        /// uncommitted is rolled back anyway) and return the error.
        async fn abandon(tx: Transaction<'static, $db>, error: CommandError) -> CommandError {
            if let Err(e) = tx.rollback().await {
                tracing::warn!(error = %e, "rolling back a transactional attempt failed; the connection drops it");
            }
            error
        }

        /// Mark the task succeeded in `tx`, commit, and tell the worker the outcome is
        /// written.
        async fn commit_success(
            storage: &$storage,
            mut tx: Transaction<'static, $db>,
            task: &TaskContext,
            result: Option<String>,
            compensation: CompensationState,
        ) -> Result<(), CommandError> {
            let params = TaskCompleteParams {
                lease: Lease {
                    id: task.id(),
                    epoch: task.lease_epoch(),
                },
                result,
                compensation,
                now: None,
            };
            let woke = match finish(&mut tx, &params).await {
                Ok(Some(woke)) => woke,
                // Cannot happen while the guarded write's lock is held.
                Ok(None) => {
                    return Err(abandon(
                        tx,
                        CommandError::retryable("lease lost inside the completion transaction"),
                    )
                    .await)
                }
                Err(e) => {
                    return Err(abandon(
                        tx,
                        CommandError::retryable(format!("completing the task failed: {e}")),
                    )
                    .await)
                }
            };
            if let Err(e) = tx.commit().await {
                return Err(CommandError::retryable(format!(
                    "the completion transaction's commit failed ({e}); if it landed, the task \
                     is succeeded and this failure is not recorded"
                )));
            }
            task.record_completion_committed();
            if woke {
                storage.wake();
            }
            Ok(())
        }

        impl<C: TransactionalCommand> Command for Transactional<C> {
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
                ctx: C::Context,
                task: &TaskContext,
            ) -> Result<C::Output, CommandError> {
                let lease = Lease {
                    id: task.id(),
                    epoch: task.lease_epoch(),
                };
                let mut tx = begin_held(&self.storage, lease).await?;
                let output = match self.command.execute_in(ctx, task, &mut tx).await {
                    Ok(output) => output,
                    Err(e) => return Err(abandon(tx, e).await),
                };
                let result = match serde_json::to_string(&output) {
                    Ok(result) => result,
                    Err(e) => {
                        let e = CommandError::permanent(format!(
                            "result does not encode as JSON: {e}"
                        ));
                        return Err(abandon(tx, e).await);
                    }
                };
                commit_success(
                    &self.storage,
                    tx,
                    task,
                    Some(result),
                    CompensationState::Succeeded,
                )
                .await?;
                Ok(output)
            }

            async fn compensate(
                &self,
                ctx: C::Context,
                task: &TaskContext,
            ) -> Result<(), CommandError> {
                let lease = Lease {
                    id: task.id(),
                    epoch: task.lease_epoch(),
                };
                let mut tx = begin_held(&self.storage, lease).await?;
                if let Err(e) = self.command.compensate_in(ctx, task, &mut tx).await {
                    // `NoCompensation` too: the worker records it as usual.
                    return Err(abandon(tx, e).await);
                }
                commit_success(&self.storage, tx, task, None, CompensationState::Succeeded)
                    .await
            }

            fn upcast(
                version: u32,
                payload: serde_json::Value,
            ) -> Result<serde_json::Value, CommandError> {
                C::upcast(version, payload)
            }

            fn retry_policy(&self) -> RetryPolicy {
                self.command.retry_policy()
            }
        }
    };
}

pub(crate) use {protocol_doc, transactional_api};

/// `hold` for a backend whose guarded no-op `UPDATE` reports the rows it matched
/// (SQLite, PostgreSQL): begin, then that write, which takes the task's row lock (on
/// SQLite, the single writer lock) until commit; `None` after a rollback when the
/// lease was lost.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! hold_by_write {
    ($db:ty, $storage:ty) => {
        async fn hold(
            storage: &$storage,
            lease: Lease,
        ) -> $crate::Result<Option<Transaction<'static, $db>>> {
            use $crate::dialect::Dialect as _;
            let mut tx = storage.begin().await?;
            let sql = $crate::dialect::sql!(
                $db,
                "UPDATE tenax_tasks SET updated_at = updated_at
                 WHERE id = ? AND status = 'running' AND lease_epoch = ?"
            );
            let held = sqlx::query(sql)
                .bind(lease.id.0)
                .bind(lease.epoch)
                .execute(&mut *tx)
                .await
                .map_err(<$db>::map_err)?;
            if held.rows_affected() == 1 {
                return Ok(Some(tx));
            }
            tx.rollback().await.map_err(<$db>::map_err)?;
            Ok(None)
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use hold_by_write;

/// `finish` for a backend that reads its clock once per transaction (SQLite, MariaDB):
/// the clock (or the caller's override), then the backend's `complete_in` at that time.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
macro_rules! finish_at_clock {
    ($db:ty) => {
        async fn finish(
            tx: &mut Transaction<'static, $db>,
            params: &TaskCompleteParams,
        ) -> $crate::Result<Option<bool>> {
            let now = clock(tx, params.now).await?;
            complete_in(tx, params, now).await
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) use finish_at_clock;
