//! The queue-control statements (list, pause, resume, limits; the claim side is in each
//! backend's `claim.rs`) written once:
//! [`queues_statements!`](crate::shared::queues::queues_statements) implements the
//! storage's `queue_list_impl` and `queue_update_impl` for one backend, with what the
//! backend spells its own way taken from its [`Dialect`] and [`QueueDialect`].
//!
//! The statements are equivalent to those each backend had by hand, not the same text:
//! - the counts are `COUNT(CASE WHEN ... THEN 1 END)` on every backend (SQLite and
//!   MariaDB had `SUM(condition)`, MariaDB cast to a signed integer; PostgreSQL
//!   `count(*) FILTER (WHERE ...)`);
//! - a change is one upsert on every backend, its new values bound again in the update
//!   part (SQLite inserted a missing row, then updated it; MariaDB read
//!   `VALUES(updated_at)`), with `CASE` where MariaDB had `IF`;
//! - the queue after the change is read with the listing's text restricted to the
//!   queue, on every backend (SQLite counted by subqueries, PostgreSQL named the queue
//!   by a bound value instead of its row);
//! - the transaction reads the clock first ([`Dialect::clock`]) on every backend:
//!   PostgreSQL wrote `COALESCE($1, now())` into the upsert (the same time: the
//!   transaction's start, or the override);
//! - `max_running` is bound and read as the backend's [`Dialect::Count`].
//!
//! A change wakes the workers of every node ([`Dialect::wake`], in the transaction) and
//! of this process (after the commit); MariaDB runs the transaction again after a lock
//! conflict.
use crate::dialect::Dialect;

/// What the queue-control statements spell their own way.
pub(crate) trait QueueDialect: Dialect {
    /// What turns the insert of a queue row whose name exists into an update of it; the
    /// assignments follow.
    const ON_QUEUE_TAKEN: &'static str = "ON CONFLICT (name) DO UPDATE SET";
}

#[cfg(feature = "sqlite")]
impl QueueDialect for sqlx::Sqlite {}

#[cfg(feature = "postgres")]
impl QueueDialect for sqlx::Postgres {}

#[cfg(feature = "mysql")]
impl QueueDialect for sqlx::MySql {
    const ON_QUEUE_TAKEN: &'static str = "ON DUPLICATE KEY UPDATE";
}

/// The end of the listing: every queue of `names`, with its controls and its counts of
/// waiting and running tasks from `counts`.
pub(crate) const QUEUE_INFO: &str =
    "SELECT n.name, COALESCE(q.paused, FALSE) AS paused, q.max_running, q.updated_at,
            COALESCE(c.waiting, 0) AS waiting, COALESCE(c.running, 0) AS running
     FROM names n
     LEFT JOIN tenax_queues q ON q.name = n.name
     LEFT JOIN counts c ON c.queue = n.name
     ORDER BY n.name";

/// The counts of waiting and running tasks per queue, of the tasks of `tenax_tasks`
/// matching the `WHERE` it is followed by.
pub(crate) const QUEUE_COUNTS: &str = "SELECT queue,
            COUNT(CASE WHEN status IN ('pending', 'retrying') THEN 1 END) AS waiting,
            COUNT(CASE WHEN status = 'running' THEN 1 END) AS running
     FROM tenax_tasks";

/// Implement the queue-control statements for the storage `$storage` of the database
/// `$db` (a [`QueueDialect`]), both given as full paths.
macro_rules! queues_statements {
    ($db:ty, $storage:ty $(,)?) => {
        mod shared {
            use sqlx::Row as _;

            use $crate::common::validate_queue_update;
            use $crate::dialect::{retrying, sql, Dialect as _};
            use $crate::error::{Result, StorageError};
            use $crate::params::{QueueChange, QueueInfo, QueueUpdateParams};
            use $crate::shared::queues::{QueueDialect, QUEUE_COUNTS, QUEUE_INFO};

            type Db = $db;
            type DbRow = <$db as sqlx::Database>::Row;

            /// A queue read with [`QUEUE_INFO`].
            fn queue_from_row(row: &DbRow) -> Result<QueueInfo> {
                let count = |column: &str| -> Result<u64> {
                    let n: i64 = row.try_get(column).map_err(Db::map_err)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                };
                let max_running: Option<<Db as $crate::dialect::Dialect>::Count> =
                    row.try_get("max_running").map_err(Db::map_err)?;
                Ok(QueueInfo {
                    name: Db::text(row, "name")?,
                    paused: row.try_get("paused").map_err(Db::map_err)?,
                    max_running: max_running
                        .map(|n| {
                            u32::try_from(n).map_err(|_| {
                                StorageError::Corrupt(format!("max_running = {n}"))
                            })
                        })
                        .transpose()?,
                    waiting: count("waiting")?,
                    running: count("running")?,
                    updated_at: Db::read_opt_time(row, "updated_at")?,
                })
            }

            /// In one transaction: create or change the queue's row, read it back with
            /// its counts, and wake every node's workers.
            async fn update_once(storage: &$storage, params: &QueueUpdateParams) -> Result<QueueInfo> {
                // `paused` NULL keeps it; `set_max` false keeps `max_running`.
                let (paused, set_max, max) = match params.change {
                    QueueChange::Pause => (Some(true), false, None),
                    QueueChange::Resume => (Some(false), false, None),
                    QueueChange::MaxRunning(max) => (None, true, max),
                };
                let max = max.map(Db::bind_count);
                let mut tx = storage.begin().await?;
                let now = Db::bind_time(Db::clock(&mut *tx, params.now).await?);
                let upsert = sql!(
                    Db,
                    "INSERT INTO tenax_queues (name, paused, max_running, updated_at)
                     VALUES (?, COALESCE(?, FALSE), CASE WHEN ? THEN ? END, ?)
                     {ON_QUEUE_TAKEN} paused = COALESCE(?, tenax_queues.paused),
                         max_running = CASE WHEN ? THEN ? ELSE tenax_queues.max_running END,
                         updated_at = ?",
                    ON_QUEUE_TAKEN = <Db as QueueDialect>::ON_QUEUE_TAKEN,
                );
                sqlx::query(upsert)
                    .bind(&params.queue)
                    .bind(paused)
                    .bind(set_max)
                    .bind(max)
                    .bind(now)
                    .bind(paused)
                    .bind(set_max)
                    .bind(max)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(Db::map_err)?;
                let read = sql!(
                    Db,
                    "WITH counts AS (
                         {QUEUE_COUNTS}
                         WHERE queue = ? AND status IN ('pending', 'retrying', 'running')
                         GROUP BY queue
                     ), names AS (SELECT name FROM tenax_queues WHERE name = ?)
                     {QUEUE_INFO}"
                );
                let row = sqlx::query(read)
                    .bind(&params.queue)
                    .bind(&params.queue)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(Db::map_err)?;
                let info = queue_from_row(&row)?;
                // Resumed or given more room: tell every node's workers.
                Db::wake(&mut *tx, &params.queue).await?;
                tx.commit().await.map_err(Db::map_err)?;
                Ok(info)
            }

            impl $storage {
                pub(in super::super) async fn queue_list_impl(&self) -> Result<Vec<QueueInfo>> {
                    let sql = sql!(
                        Db,
                        "WITH counts AS (
                             {QUEUE_COUNTS}
                             WHERE status IN ('pending', 'retrying', 'running')
                             GROUP BY queue
                         ), names AS (
                             SELECT queue AS name FROM counts UNION SELECT name FROM tenax_queues
                         )
                         {QUEUE_INFO}"
                    );
                    let rows = sqlx::query(sql)
                        .fetch_all(self.pool())
                        .await
                        .map_err(Db::map_err)?;
                    rows.iter().map(queue_from_row).collect()
                }

                pub(in super::super) async fn queue_update_impl(
                    &self,
                    params: &QueueUpdateParams,
                ) -> Result<QueueInfo> {
                    validate_queue_update(params)?;
                    let info = retrying::<Db, _, _, _>(|| update_once(self, params)).await?;
                    self.wake();
                    Ok(info)
                }
            }
        }
    };
}
pub(crate) use queues_statements;
