//! What the three SQL dialects spell differently, said once per backend, so that a
//! statement that differs between them only in spelling is written once.
//!
//! A shared statement is written with `?` placeholders, bound in order (a value used
//! twice is bound twice), and [`sql!`](crate::dialect::sql) turns it into the backend's
//! text once per process: PostgreSQL numbers the placeholders (`$1`, `$2`, ...), SQLite
//! and MariaDB take it as written. What else differs (the type a time or a count is
//! bound as, how a text column is read, the locking clause, the answer to a taken
//! `task_no`, whether `UPDATE ... RETURNING` exists, the wake-up of a queue) is a member
//! of [`Dialect`], converted there and nowhere else.
//!
//! Statements whose plans or locking differ between the backends (the claim, the bulk
//! insert, the propagation through a workflow's dependencies) stay hand-written in each
//! backend.
use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;
use tenax_core::TaskRecord;

use crate::error::{Result, StorageError};

/// The columns every task query selects, in each backend's `task_from_row` terms.
pub(crate) const TASK_COLUMNS: &str =
    "id, task_no, kind, parent_id, command_type, payload, payload_version, queue, \
     priority, status, attempt, max_attempts, lease_epoch, lease_owner, lease_expires_at, run_at, \
     timeout_ms, last_error, result, compensation, created_at, updated_at, started_at, finished_at, \
     concurrency_key, concurrency_limit, created_by";

/// One backend's spelling of what the shared statements need.
pub(crate) trait Dialect: sqlx::Database {
    /// Placeholders are numbered (`$1`) rather than `?`.
    const NUMBERED: bool = false;
    /// Appended to a `SELECT` to lock its rows until the transaction ends (empty on
    /// SQLite, whose single writer holds every row already).
    const FOR_UPDATE: &'static str;
    /// Appended to a `SELECT` to share-lock its rows until the transaction ends.
    const FOR_SHARE: &'static str;
    /// Appended to an `INSERT` of a task: a taken `task_no` inserts nothing, and is no
    /// error.
    const ON_TASK_NO_TAKEN: &'static str = "ON CONFLICT (task_no) DO NOTHING";
    /// `COUNT(*)`, as a column that decodes as `i64`.
    const COUNT: &'static str = "COUNT(*)";
    /// `UPDATE ... RETURNING` exists (MariaDB has none: the row is read back by id).
    const UPDATE_RETURNING: bool = true;

    /// A time as the backend's time columns hold it.
    type Time;
    /// `t` as bound (SQLite: milliseconds; PostgreSQL: `timestamptz`; MariaDB:
    /// `DATETIME(6)`, UTC, clamped to its range).
    fn time(t: DateTime<Utc>) -> Self::Time;
    /// A count (attempts, parents, a payload version) as its `INTEGER` column holds it.
    type Count;
    /// `n` as bound (PostgreSQL's columns are 32-bit: a larger count is clamped).
    fn count(n: u32) -> Self::Count;

    /// A sqlx error in the normalised kinds.
    fn map_err(err: sqlx::Error) -> StorageError;
    /// A time column.
    fn read_time(row: &Self::Row, column: &str) -> Result<DateTime<Utc>>;
    /// A nullable time column.
    fn read_opt_time(row: &Self::Row, column: &str) -> Result<Option<DateTime<Utc>>>;
    /// A text column.
    fn text(row: &Self::Row, column: &str) -> Result<String>;
    /// A nullable text column.
    fn opt_text(row: &Self::Row, column: &str) -> Result<Option<String>>;
    /// A task read with [`TASK_COLUMNS`].
    fn task(row: &Self::Row) -> Result<TaskRecord>;
    /// Append `IN` the list `ids` (never empty) to a `WHERE column`.
    fn push_ids(qb: &mut QueryBuilder<'_, Self>, ids: &[i64]);
    /// Tell other processes that `queue` has a task due (PostgreSQL's `NOTIFY`; the
    /// other backends' probes see it by themselves, so they do nothing here).
    fn wake(conn: &mut Self::Connection, queue: &str) -> impl Future<Output = Result<()>> + Send {
        let _ = (conn, queue);
        async { Ok(()) }
    }
}

/// `sql` in `D`'s placeholders: each `?` outside a quoted literal becomes `$1`, `$2`,
/// ... where they are numbered.
pub(crate) fn placeholders<D: Dialect>(sql: String) -> String {
    if !D::NUMBERED {
        return sql;
    }
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    let mut quoted = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

/// ` RETURNING` the task's columns where `UPDATE ... RETURNING` exists, else nothing.
pub(crate) fn returning_task<D: Dialect>() -> String {
    if D::UPDATE_RETURNING {
        format!(" RETURNING {TASK_COLUMNS}")
    } else {
        String::new()
    }
}

/// A shared statement in the backend `$db`'s placeholders, as a `&'static str`: the
/// `format!` arguments are rendered and the placeholders rewritten once per process.
macro_rules! sql {
    ($db:ty, $($format:tt)+) => {{
        static SQL: ::std::sync::LazyLock<String> = ::std::sync::LazyLock::new(|| {
            $crate::dialect::placeholders::<$db>(format!($($format)+))
        });
        SQL.as_str()
    }};
}
pub(crate) use sql;

#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
mod tests {
    use super::placeholders;

    #[test]
    fn placeholders_are_numbered_outside_quotes_only_where_the_dialect_numbers_them() {
        let sql = "UPDATE t SET a = ?, b = '?' WHERE c = ? AND d = ?".to_owned();
        assert_eq!(
            placeholders::<sqlx::Postgres>(sql.clone()),
            "UPDATE t SET a = $1, b = '?' WHERE c = $2 AND d = $3"
        );
        assert_eq!(placeholders::<sqlx::Sqlite>(sql.clone()), sql);
    }
}
