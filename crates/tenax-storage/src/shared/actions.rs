//! The operator's actions on one task (cancel, retry) that differ between the backends
//! only in spelling, written once:
//! [`action_statements!`](crate::shared::actions::action_statements) implements them
//! for one backend, with what it spells its own way taken from its
//! [`Dialect`](crate::dialect::Dialect) and from the two steps the backend names in the
//! invocation: how it reads the task an action names (MariaDB locks it, `FOR UPDATE`;
//! SQLite and PostgreSQL read it plainly, the write's condition deciding), and how it
//! records a cancel request on a running task.
//!
//! Each action is one transaction, and every write in it is conditional on the status
//! it expects, as before. The cancel written here (SQLite, PostgreSQL) writes first:
//! `UPDATE ... WHERE (id = ? OR task_no = ?) AND status IN (waiting) ... RETURNING`,
//! and only when that matched nothing reads the task, to request the cancel of a
//! running one or to say why it refused. MariaDB's cancel locks the task by its
//! reference first (an `UPDATE` by id or number there would lock every row its plan
//! reads): it stays in its `actions.rs`, and shares [`cancel_refused`].
//!
//! The shared statements are equivalent to those each backend had by hand, not the
//! same text: PostgreSQL's cancel reads the time with
//! [`Dialect::clock`](crate::dialect::Dialect::clock) and binds it instead of writing
//! `COALESCE($1, now())` in the statement (the same time, in the same transaction);
//! MariaDB's retry passes the workflow code the clock's time as read (or the caller's
//! override as given) rather than first rounded to `DATETIME(6)`: every write of it is
//! rounded when bound, as before.
use tenax_core::{TaskKind, TaskRecord};

use crate::common::refusal;
use crate::error::StorageError;
use crate::params::TaskRef;

/// Why a cancel of `task` changed nothing, `current` being the task as read (if it
/// exists): a compensation is never cancelled (the compensated task would wait for it
/// forever), and any other task was missing or in a status a cancel does not take.
pub(crate) fn cancel_refused(task: &TaskRef, current: Option<TaskRecord>) -> StorageError {
    if let Some(compensation) = current.as_ref().filter(|t| t.kind == TaskKind::Compensate) {
        return StorageError::InvalidState {
            task: task.to_string(),
            status: compensation.status,
            action: "cancel a compensation",
        };
    }
    refusal(task, current, "cancel it")
}

/// Implement the retry (as the method `retry`) and, when `cancel` is given, the cancel
/// of one task for the storage `$storage` on the database `$db`, both given as full
/// paths.
///
/// `read(tx, task) = EXPR` reads the task `task` (a `&TaskRef`) names in the
/// transaction `tx` (a `&mut Transaction<'static, $db>`): `EXPR` is a future of
/// `Result<Option<TaskRecord>>`, written in the invoking module. So is
/// `request_cancel(tx, id, now) = EXPR`, which records a cancel request on the running
/// task `id` at `now` (the backend's `Dialect::Time`) and answers whether it did.
macro_rules! action_statements {
    (
        $storage:ty,
        $db:ty,
        read($read_tx:ident, $read_task:ident) = $read:expr,
        retry: $retry:ident
        $(,
            cancel: $cancel:ident,
            request_cancel($req_tx:ident, $req_id:ident, $req_now:ident) = $request:expr
        )?
        $(,)?
    ) => {
        /// The task an action names, read in the action's transaction.
        async fn action_read(
            $read_tx: &mut sqlx::Transaction<'static, $db>,
            $read_task: &$crate::params::TaskRef,
        ) -> $crate::error::Result<Option<tenax_core::TaskRecord>> {
            $read.await
        }

        $(
            /// Record a cancel request on a running task; whether this did.
            async fn action_request_cancel(
                $req_tx: &mut sqlx::Transaction<'static, $db>,
                $req_id: tenax_core::TaskId,
                $req_now: <$db as $crate::dialect::Dialect>::Time,
            ) -> $crate::error::Result<bool> {
                $request.await
            }
        )?

        mod shared_actions {
            use tenax_core::TaskRecord;

            use $crate::dialect::Dialect as _;
            use $crate::error::Result;
            use $crate::params::TaskActionParams;

            type Db = $db;

            impl $storage {
                /// Retry a dead task (or a dead compensation): what may be retried, and
                /// how, is `crate::redrive`'s.
                pub(crate) async fn $retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
                    let mut tx = self.begin().await?;
                    let now = Db::clock(&mut *tx, params.now).await?;
                    let current = super::action_read(&mut tx, &params.task).await?;
                    let (task, woke) =
                        $crate::redrive::retry(&mut *tx, &params.task, current, now).await??;
                    tx.commit().await.map_err(Db::map_err)?;
                    if woke {
                        self.wake();
                    }
                    Ok(task)
                }

                $(
                    /// Cancel a waiting task at once, or request the cancel of a running
                    /// one.
                    pub(crate) async fn $cancel(
                        &self,
                        params: &TaskActionParams,
                    ) -> Result<TaskRecord> {
                        use tenax_core::{TaskKind, TaskStatus};

                        use $crate::dialect::{sql, TASK_COLUMNS};

                        let mut tx = self.begin().await?;
                        let now = Db::clock(&mut *tx, params.now).await?;
                        let (by_id, by_no) = $crate::common::split_ref(&params.task);
                        let sql = sql!(
                            Db,
                            "UPDATE tenax_tasks SET status = 'cancelled', finished_at = ?,
                                 updated_at = ?
                             WHERE (id = ? OR task_no = ?)
                               AND status IN ('pending', 'retrying', 'blocked')
                               AND kind = 'execute'
                             RETURNING {TASK_COLUMNS}"
                        );
                        let row = sqlx::query(sql)
                            .bind(Db::bind_time(now))
                            .bind(Db::bind_time(now))
                            .bind(by_id)
                            .bind(by_no)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err(Db::map_err)?;
                        if let Some(row) = row {
                            let task = Db::task_from_row(&row)?;
                            let woke = $crate::flow::after_finish(&mut *tx, &task, now).await?;
                            tx.commit().await.map_err(Db::map_err)?;
                            if woke {
                                self.wake();
                            }
                            return Ok(task);
                        }
                        let current = super::action_read(&mut tx, &params.task).await?;
                        if let Some(task) = current.as_ref().filter(|t| {
                            t.kind == TaskKind::Execute && t.status == TaskStatus::Running
                        }) {
                            let requested =
                                super::action_request_cancel(&mut tx, task.id, Db::bind_time(now))
                                    .await?;
                            if requested {
                                tx.commit().await.map_err(Db::map_err)?;
                                return Ok(task.clone());
                            }
                        }
                        tx.rollback().await.map_err(Db::map_err)?;
                        Err($crate::shared::actions::cancel_refused(&params.task, current))
                    }
                )?
            }
        }
    };
}
pub(crate) use action_statements;
