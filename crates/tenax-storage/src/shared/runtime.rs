//! The runtime's support statements where the backends differ only in spelling,
//! written once: [`runtime_statements!`](crate::shared::runtime::runtime_statements)
//! records a cancel request on a running task; its `clocked` arm adds the due backlog
//! of queues on SQLite and MariaDB. [`leases`] reads back the leases a statement
//! answers (cancel requests, renewals).
//!
//! What stays in each backend: the next run time (PostgreSQL reads the claim index once
//! per queue and priority through `LATERAL`, SQLite matches the offers through
//! `json_each`, MariaDB spells them out), the cancel requests and the due count (a list
//! in each backend's form), the lease renewal (PostgreSQL's one `UPDATE` over `unnest`,
//! MariaDB's lock by primary key first, SQLite's in its storage), and PostgreSQL's
//! backlog (one statement over `unnest ... WITH ORDINALITY`).
//!
//! Equivalent, not identical, to what each backend had: the cancel request binds its
//! time twice (`?`, `?`) where SQLite named `?1` twice, and on PostgreSQL it is
//! `COALESCE($1::timestamptz, now())` and `COALESCE($2::timestamptz, now())`, both the
//! same override or the transaction's start; MariaDB's backlog reads the clock once for
//! all its queues (it read `UTC_TIMESTAMP(6)` in each queue's statement), as SQLite's
//! did, and counts with [`Dialect::COUNT_STAR`](crate::dialect::Dialect::COUNT_STAR).
use tenax_core::TaskId;

use crate::params::Lease;

/// The leases of `(id, lease_epoch)` rows.
pub(crate) fn leases(rows: Vec<(i64, i64)>) -> Vec<Lease> {
    rows.into_iter()
        .map(|(id, epoch)| Lease {
            id: TaskId(id),
            epoch,
        })
        .collect()
}

/// The shared runtime statements for the database `$db` (a
/// [`Stamp`](crate::shared::outcomes::Stamp)), given as a full path: the cancel request,
/// named `$request_cancel` (`(tx, id, at)`). With `clocked` first (SQLite, MariaDB) also
/// `queue_backlog(pool, params)`.
macro_rules! runtime_statements {
    (clocked $db:ty, $request_cancel:ident) => {
        $crate::shared::runtime::runtime_statements!($db, $request_cancel);

        mod clocked_runtime {
            use sqlx::Row as _;

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::params::{QueueBacklog, QueueBacklogParams};

            type Db = $db;

            /// The due tasks of each queue (`pending` or `retrying`, due by the clock
            /// read once), and the oldest one's due time.
            pub(crate) async fn queue_backlog(
                pool: &sqlx::Pool<Db>,
                params: &QueueBacklogParams,
            ) -> Result<Vec<QueueBacklog>> {
                let mut conn = pool.acquire().await.map_err(Db::map_err)?;
                let now = Db::bind_time(Db::clock(&mut *conn, params.now).await?);
                let sql = sql!(
                    Db,
                    "SELECT {COUNT_STAR} AS due, MIN(run_at) AS oldest FROM tenax_tasks
                     WHERE queue = ? AND status IN ('pending', 'retrying') AND run_at <= ?",
                    COUNT_STAR = Db::COUNT_STAR
                );
                let mut backlog = Vec::with_capacity(params.queues.len());
                for queue in &params.queues {
                    let row = sqlx::query(sql)
                        .bind(queue.as_str())
                        .bind(now)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(Db::map_err)?;
                    let due: i64 = row.try_get("due").map_err(Db::map_err)?;
                    backlog.push(QueueBacklog {
                        queue: queue.clone(),
                        due: u64::try_from(due).unwrap_or(0),
                        oldest_due_at: Db::read_opt_time(&row, "oldest")?,
                    });
                }
                Ok(backlog)
            }
        }
        pub(super) use clocked_runtime::queue_backlog;
    };
    ($db:ty, $request_cancel:ident) => {
        mod shared_runtime {
            use sqlx::Transaction;
            use tenax_core::TaskId;

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::shared::outcomes::Stamp;

            type Db = $db;

            /// Record a cancel request on a running task at `at` (the first
            /// request's time is kept).
            pub(crate) async fn $request_cancel(
                tx: &mut Transaction<'static, Db>,
                id: TaskId,
                at: <Db as Stamp>::At,
            ) -> Result<bool> {
                let sql = sql!(
                    Db,
                    "UPDATE tenax_tasks
                     SET cancel_requested_at = COALESCE(cancel_requested_at, {AT}), updated_at = {AT}
                     WHERE id = ? AND status = 'running' AND kind = 'execute'",
                    AT = <Db as Stamp>::AT
                );
                let done = sqlx::query(sql)
                    .bind(at)
                    .bind(at)
                    .bind(id.0)
                    .execute(&mut **tx)
                    .await
                    .map_err(Db::map_err)?;
                Ok(done.rows_affected() == 1)
            }
        }
        pub(super) use shared_runtime::$request_cancel;
    };
}
pub(crate) use runtime_statements;
