//! A task's outcome (completion, failure, the reaper's expiry) where the backends
//! differ only in spelling, written once:
//! [`outcomes_statements!`](crate::shared::outcomes::outcomes_statements) closes an
//! attempt, and writes what follows the statement that fenced a failure or an expiry
//! (closing the attempts, the wake-up of a queue due again, the workflow's next step,
//! the commit); its `clocked` arm adds what SQLite and MariaDB, which read the clock
//! once per transaction, share besides (the one-task completion's transaction, the
//! reaper's `expires_beyond`). [`Stamp`] says how a statement writes its transaction's
//! time.
//!
//! The statements that fence an outcome (`status = 'running' AND lease_epoch = ?`) stay
//! in each backend: PostgreSQL's are tuned for plans and round trips (the time inline,
//! arrays, the attempt closed in the same statement), MariaDB locks the row first and
//! decides in Rust what its left-to-right `SET` could not, and SQLite's single writer
//! writes with `RETURNING`.
//!
//! The shared text is the text each backend had, but for its layout: PostgreSQL's
//! `close_attempt` is `finished_at = COALESCE($1::timestamptz, now())` as before.
//! Equivalent, not identical: the time handed to the workflow after a failure or an
//! expiry is the written task's `updated_at` on every backend (SQLite and MariaDB
//! passed the clock they had written there, the same value); a failure's attempt is
//! closed, and the workflow moved, by the same code on MariaDB for a retry too (where
//! [`crate::flow::ended`] does nothing, as MariaDB skipped it); and PostgreSQL's
//! `NOTIFY` of a queue due again is [`Dialect::wake`](crate::dialect::Dialect::wake),
//! nothing on the other two, as before.
use std::future::Future;

use chrono::{DateTime, Utc};

use crate::dialect::Dialect;
use crate::error::Result;

/// How the statements of one transaction write its time.
pub(crate) trait Stamp: Dialect {
    /// What such a statement binds for the time.
    type At: Copy + Send + Sync + 'static;
    /// The time in such a statement's text, one placeholder: `?` where the bound value
    /// is the time (SQLite, MariaDB), `COALESCE(?::timestamptz, now())` on PostgreSQL,
    /// which binds the caller's override and takes the transaction's start without it.
    const AT: &'static str;
    /// The time for the statements of a transaction on `conn`: the caller's override,
    /// else the database clock read once (SQLite, MariaDB); on PostgreSQL the override
    /// as it is, without a round trip. Only the clocked backends' shared completion asks
    /// it.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    fn at(
        conn: &mut Self::Connection,
        now: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<Self::At>> + Send;
}

/// The items of a batch of completions not named earlier in it, in order (a repeated
/// lease is lost: `repeated` as [`crate::common::repeated_leases`] says).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn first_named<'p>(
    params: &'p [crate::params::TaskCompleteParams],
    repeated: &[bool],
) -> Vec<&'p crate::params::TaskCompleteParams> {
    params
        .iter()
        .zip(repeated)
        .filter(|(_, repeated)| !**repeated)
        .map(|(item, _)| item)
        .collect()
}

/// What became of each item of a batch of completions: a repeated lease is lost, a
/// lease in `landed` was written with the batch, one in `alone` still holds and is left
/// to the one-task path, any other is lost.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn verdicts(
    params: &[crate::params::TaskCompleteParams],
    repeated: &[bool],
    landed: &std::collections::HashSet<(i64, i64)>,
    alone: &std::collections::HashSet<(i64, i64)>,
) -> Vec<crate::params::BatchCompletion> {
    use crate::params::BatchCompletion;
    params
        .iter()
        .zip(repeated)
        .map(|(p, repeated)| {
            let lease = (p.lease.id.0, p.lease.epoch);
            if *repeated {
                BatchCompletion::Lost
            } else if landed.contains(&lease) {
                BatchCompletion::Landed
            } else if alone.contains(&lease) {
                BatchCompletion::Alone
            } else {
                BatchCompletion::Lost
            }
        })
        .collect()
}

/// The shared outcome statements for the database `$db` (a [`Stamp`]) and its storage
/// `$storage`, both given as full paths: `close_attempt`, and the storage's
/// `failed` and `reaped` (what follows the fenced write). With `clocked` first (SQLite,
/// MariaDB) also the database's [`Stamp`] (the clock read once, bound as
/// [`Dialect::Time`](crate::dialect::Dialect::Time)), the storage's `complete_once`,
/// which runs the backend's `complete_in(tx, params, at)` in a transaction of its own,
/// and `reap_beyond_at`.
macro_rules! outcomes_statements {
    (clocked $db:ty, $storage:ty) => {
        $crate::shared::outcomes::outcomes_statements!($db, $storage);

        /// The statements write the clock read once per transaction, as its time
        /// columns hold it.
        impl $crate::shared::outcomes::Stamp for $db {
            type At = <$db as $crate::dialect::Dialect>::Time;
            const AT: &'static str = "?";
            async fn at(
                conn: &mut <$db as sqlx::Database>::Connection,
                now: Option<chrono::DateTime<chrono::Utc>>,
            ) -> $crate::error::Result<Self::At> {
                use $crate::dialect::Dialect as _;
                Ok(Self::bind_time(Self::clock(conn, now).await?))
            }
        }

        mod clocked_outcomes {
            use sqlx::Transaction;

            use $crate::dialect::Dialect as _;
            use $crate::error::Result;
            use $crate::params::{TaskCompleteParams, TaskReapParams};
            use $crate::shared::outcomes::Stamp;

            type Db = $db;
            type At = <$db as Stamp>::At;

            impl $storage {
                /// One attempt at
                /// [`Storage::task_complete_if_leased`](crate::Storage::task_complete_if_leased):
                /// the completion in a transaction of its own, at one reading of the
                /// clock.
                pub(crate) async fn complete_once(
                    &self,
                    params: &TaskCompleteParams,
                ) -> Result<bool> {
                    let mut tx = self.begin().await?;
                    let at = Db::at(&mut *tx, params.now).await?;
                    let Some(woke) = super::complete_in(&mut tx, params, at).await? else {
                        tx.rollback().await.map_err(Db::map_err)?;
                        return Ok(false);
                    };
                    tx.commit().await.map_err(Db::map_err)?;
                    if woke {
                        self.wake();
                    }
                    Ok(true)
                }
            }

            /// The reaper's `expires_beyond`, moved by the time between the caller's
            /// override and the clock of `tx` ([`crate::common::reap_beyond`]), as bound.
            pub(crate) async fn reap_beyond_at(
                tx: &mut Transaction<'static, Db>,
                params: &TaskReapParams,
            ) -> Result<Option<At>> {
                if params.expires_beyond.is_none() {
                    return Ok(None);
                }
                let statement_now = Db::clock(&mut **tx, None).await?;
                let beyond =
                    $crate::common::reap_beyond(params.now, params.expires_beyond, statement_now);
                Ok(beyond.map(Db::bind_time))
            }
        }
        use clocked_outcomes::reap_beyond_at;
    };
    ($db:ty, $storage:ty) => {
        mod shared_outcomes {
            use sqlx::Transaction;
            use tenax_core::{AttemptOutcome, TaskRecord, TaskStatus};

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::params::{Lease, ReapedTask};
            use $crate::shared::outcomes::Stamp;

            type Db = $db;
            type At = <$db as Stamp>::At;

            /// Close the attempt `lease` names (if still open) at `at`.
            pub(crate) async fn close_attempt(
                tx: &mut Transaction<'static, Db>,
                lease: Lease,
                outcome: AttemptOutcome,
                error: Option<&str>,
                at: At,
            ) -> Result<()> {
                let sql = sql!(
                    Db,
                    "UPDATE tenax_attempts SET finished_at = {AT}, outcome = ?, error = ?
                     WHERE task_id = ? AND epoch = ? AND outcome = 'running'",
                    AT = <Db as Stamp>::AT
                );
                sqlx::query(sql)
                    .bind(at)
                    .bind(outcome.as_str())
                    .bind(error)
                    .bind(lease.id.0)
                    .bind(lease.epoch)
                    .execute(&mut **tx)
                    .await
                    .map_err(Db::map_err)?;
                Ok(())
            }

            impl $storage {
                /// After the write that failed `task` (as written) under `lease`: close
                /// the attempt (`dead` or `failed`, with `error`), wake the queue of a
                /// retry due now, move what follows (compensation, workflow), commit
                /// and wake this process's workers. Always `true`: the failure landed.
                pub(crate) async fn failed(
                    &self,
                    mut tx: Transaction<'static, Db>,
                    lease: Lease,
                    task: &TaskRecord,
                    error: &str,
                    at: At,
                    due_now: bool,
                ) -> Result<bool> {
                    let outcome = if task.status == TaskStatus::Dead {
                        AttemptOutcome::Dead
                    } else {
                        AttemptOutcome::Failed
                    };
                    close_attempt(&mut tx, lease, outcome, Some(error), at).await?;
                    if due_now && task.status == TaskStatus::Retrying {
                        Db::wake(&mut *tx, &task.queue).await?;
                    }
                    $crate::flow::ended(&mut *tx, task, task.updated_at).await?;
                    tx.commit().await.map_err(Db::map_err)?;
                    self.wake();
                    Ok(true)
                }

                /// After the reaper's write of `tasks` (as written): close each one's
                /// attempt (`lease_expired`, with the error written), wake the queue of
                /// each that runs again, move what follows, commit and wake this
                /// process's workers.
                pub(crate) async fn reaped(
                    &self,
                    mut tx: Transaction<'static, Db>,
                    tasks: Vec<TaskRecord>,
                    at: At,
                ) -> Result<Vec<ReapedTask>> {
                    for task in &tasks {
                        let lease = Lease {
                            id: task.id,
                            epoch: task.lease_epoch,
                        };
                        let error = task.last_error.as_deref();
                        close_attempt(&mut tx, lease, AttemptOutcome::LeaseExpired, error, at)
                            .await?;
                        if task.status != TaskStatus::Dead {
                            Db::wake(&mut *tx, &task.queue).await?;
                        }
                        $crate::flow::ended(&mut *tx, task, task.updated_at).await?;
                    }
                    tx.commit().await.map_err(Db::map_err)?;
                    if !tasks.is_empty() {
                        self.wake();
                    }
                    Ok(tasks
                        .into_iter()
                        .map(|t| ReapedTask {
                            id: t.id,
                            status: t.status,
                        })
                        .collect())
                }
            }
        }
        use shared_outcomes::close_attempt;
    };
}
pub(crate) use outcomes_statements;
