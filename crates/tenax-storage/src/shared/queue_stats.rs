//! The statement of [`Storage::queue_stats`](crate::Storage::queue_stats) written once:
//! [`queue_stats_statements!`](crate::shared::queue_stats::queue_stats_statements)
//! defines, for one backend, the `queue_stats` function its storage calls: the counts by
//! queue and status, with each queue's backlog and oldest due age, in one read-only
//! statement on the database clock (or the caller's override).
//!
//! The statement is equivalent to those each backend had by hand, not the same text: the
//! clock is read first, on the same connection ([`Dialect::clock`](crate::dialect::Dialect::clock)),
//! and bound (PostgreSQL had `COALESCE($1, now())` in a CTE of the statement); the due
//! tasks are counted with `COUNT(CASE WHEN ... THEN 1 END)` (SQLite and MariaDB summed a
//! `CASE`, PostgreSQL had `FILTER`); and the statement returns the oldest due run time,
//! whose age is taken from the clock read, to the microsecond, on every backend (as
//! MariaDB did: SQLite subtracted milliseconds in SQL, PostgreSQL took the epoch of an
//! interval).
//!
//! The same goes for `stats` ([`Storage::stats`](crate::Storage::stats)): its oldest due
//! task is read against the clock read first on the same connection, and its age kept
//! to the microsecond (PostgreSQL compared with the statement's `now()` and kept
//! milliseconds).

/// Define `queue_stats(pool, now)` for the database `$db` (a
/// [`Dialect`](crate::dialect::Dialect)), given as a full path, in the module that
/// invokes it; with `stats`, also `stats(pool)`, what
/// [`Storage::stats`](crate::Storage::stats) answers.
macro_rules! queue_stats_statements {
    (@with $db:ty, { $($extra:tt)* }) => {
        pub(super) use shared::queue_stats;

        mod shared {
            use chrono::{DateTime, Utc};
            use sqlx::Row as _;
            use tenax_core::TaskStatus;

            use $crate::dialect::{sql, Dialect as _};
            use $crate::error::Result;
            use $crate::params::QueueStats;
            use $crate::queue_stats::{age_from_ms, fold, QueueStatusRow};

            type Db = $db;

            /// Counts by queue and status, with each queue's backlog and oldest due age:
            /// one read-only statement on the database clock (or the override).
            pub(in super::super) async fn queue_stats(
                pool: &sqlx::Pool<Db>,
                now: Option<DateTime<Utc>>,
            ) -> Result<Vec<QueueStats>> {
                let mut conn = pool.acquire().await.map_err(Db::map_err)?;
                let now = Db::clock(&mut *conn, now).await?;
                let sql = sql!(
                    Db,
                    "SELECT queue, status, {COUNT_STAR} AS n,
                            COUNT(CASE WHEN run_at <= ? THEN 1 END) AS due,
                            MIN(CASE WHEN run_at <= ? THEN run_at END) AS oldest
                     FROM tenax_tasks GROUP BY queue, status",
                    COUNT_STAR = Db::COUNT_STAR,
                );
                let at = Db::bind_time(now);
                let rows = sqlx::query(sql)
                    .bind(at)
                    .bind(at)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                let mut out = Vec::with_capacity(rows.len());
                for row in &rows {
                    let count: i64 = row.try_get("n").map_err(Db::map_err)?;
                    let due: i64 = row.try_get("due").map_err(Db::map_err)?;
                    let oldest = Db::read_opt_time(row, "oldest")?;
                    out.push(QueueStatusRow {
                        queue: Db::text(row, "queue")?,
                        status: Db::text(row, "status")?.parse::<TaskStatus>()?,
                        count: u64::try_from(count).unwrap_or(0),
                        due: u64::try_from(due).unwrap_or(0),
                        oldest_due_age: oldest.map(|oldest| {
                            let us = (now - oldest).num_microseconds().unwrap_or(i64::MAX);
                            age_from_ms(us as f64 / 1000.0)
                        }),
                    });
                }
                Ok(fold(out))
            }

            $($extra)*
        }
    };
    ($db:ty, stats $(,)?) => {
        $crate::shared::queue_stats::queue_stats_statements!(@with $db, {
            use $crate::params::Stats;

            /// Counts by command type and status, and the age of the oldest due task
            /// (database clock).
            pub(in super::super) async fn stats(pool: &sqlx::Pool<Db>) -> Result<Stats> {
                let mut conn = pool.acquire().await.map_err(Db::map_err)?;
                let sql = sql!(
                    Db,
                    "SELECT command_type, status, {COUNT_STAR} AS n FROM tenax_tasks
                     GROUP BY command_type, status ORDER BY command_type, status",
                    COUNT_STAR = Db::COUNT_STAR,
                );
                let rows = sqlx::query(sql)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                let mut stats = Stats::default();
                for row in &rows {
                    let command_type = Db::text(row, "command_type")?;
                    let status: TaskStatus = Db::text(row, "status")?.parse()?;
                    let n: i64 = row.try_get("n").map_err(Db::map_err)?;
                    let n = u64::try_from(n).unwrap_or(0);
                    stats.by_type.push((command_type, status, n));
                    match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
                        Some((_, total)) => *total += n,
                        None => stats.by_status.push((status, n)),
                    }
                }
                stats.by_status.sort();
                let now = Db::clock(&mut *conn, None).await?;
                let sql = sql!(
                    Db,
                    "SELECT MIN(run_at) AS oldest FROM tenax_tasks
                     WHERE status IN ('pending', 'retrying') AND run_at <= ?"
                );
                let row = sqlx::query(sql)
                    .bind(Db::bind_time(now))
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(Db::map_err)?;
                stats.oldest_due_age = Db::read_opt_time(&row, "oldest")?
                    .map(|oldest| (now - oldest).to_std().unwrap_or_default());
                Ok(stats)
            }
        });
        pub(super) use shared::stats;
    };
    ($db:ty $(,)?) => {
        $crate::shared::queue_stats::queue_stats_statements!(@with $db, {});
    };
}
pub(crate) use queue_stats_statements;
