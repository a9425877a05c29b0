//! What the three SQL dialects spell differently, said once per backend, so that a
//! statement that differs between them only in spelling is written once.
//!
//! A shared statement is written with `?` placeholders, bound in order (a value used
//! twice is bound twice), and [`sql!`](crate::dialect::sql) turns it into the backend's
//! text once per process: PostgreSQL numbers the placeholders (`$1`, `$2`, ...), SQLite
//! and MariaDB take it as written. What else differs (the type a time or a count is
//! bound as, how a text column is read, the locking clause, the answer to a taken
//! `task_no`, whether `UPDATE ... RETURNING` exists, the wake-up of a queue) is a member
//! of [`Dialect`]: the shared statements convert it there and nowhere else. The
//! statements each backend still writes by hand spell it their own way.
//!
//! Statements whose plans or locking differ between the backends (the claim, the bulk
//! insert, the propagation through a workflow's dependencies) stay hand-written in each
//! backend.
use std::future::Future;

use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;
use tenax_core::TaskRecord;

use crate::error::{Result, StorageError};
use crate::params::{InsertAccept, TaskInsertManyChecked, TaskInsertOutcome};

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
    const COUNT_STAR: &'static str = "COUNT(*)";
    /// `UPDATE ... RETURNING` exists (MariaDB has none: the row is read back by id).
    const UPDATE_RETURNING: bool = true;

    /// A time as the backend's time columns hold it.
    type Time;
    /// `t` as bound (SQLite: milliseconds; PostgreSQL: `timestamptz`; MariaDB:
    /// `DATETIME(6)`, UTC, clamped to its range).
    fn bind_time(t: DateTime<Utc>) -> Self::Time;
    /// A count (attempts, parents, a payload version) as its `INTEGER` column holds it.
    type Count;
    /// `n` as bound (PostgreSQL's columns are 32-bit: a larger count is clamped).
    fn bind_count(n: u32) -> Self::Count;

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
    fn task_from_row(row: &Self::Row) -> Result<TaskRecord>;
    /// Append `IN` the list `ids` (never empty) to a `WHERE column`.
    fn push_ids(qb: &mut QueryBuilder<'_, Self>, ids: &[i64]);
    /// The caller's override `now`, else the database clock, read on `conn` (inside a
    /// transaction: PostgreSQL's `now()` is the transaction's start).
    fn clock(
        conn: &mut Self::Connection,
        now: Option<DateTime<Utc>>,
    ) -> impl Future<Output = Result<DateTime<Utc>>> + Send;
    /// `err` lost a lock conflict (a deadlock, a lock-wait timeout) after which the whole
    /// transaction may simply run again; [`retrying`] runs it again. Only MariaDB's
    /// writes lose them: SQLite has one writer, and PostgreSQL's row locks wait.
    fn is_lock_conflict(err: &StorageError) -> bool {
        let _ = err;
        false
    }
    /// Tell other processes that `queue` has a task due (PostgreSQL's `NOTIFY`; the
    /// other backends' probes see it by themselves, so they do nothing here).
    fn wake(conn: &mut Self::Connection, queue: &str) -> impl Future<Output = Result<()>> + Send {
        let _ = (conn, queue);
        async { Ok(()) }
    }
}

/// [`Dialect::read_time`] and [`Dialect::read_opt_time`] for a backend whose driver
/// decodes its time columns as `DateTime<Utc>` (PostgreSQL's `timestamptz`, MariaDB's
/// `DATETIME(6)` on a UTC session).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! decoded_times {
    () => {
        fn read_time(
            row: &Self::Row,
            column: &str,
        ) -> $crate::error::Result<chrono::DateTime<chrono::Utc>> {
            sqlx::Row::try_get(row, column).map_err(Self::map_err)
        }
        fn read_opt_time(
            row: &Self::Row,
            column: &str,
        ) -> $crate::error::Result<Option<chrono::DateTime<chrono::Utc>>> {
            sqlx::Row::try_get(row, column).map_err(Self::map_err)
        }
    };
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use decoded_times;

/// [`Dialect::text`] and [`Dialect::opt_text`] for a backend whose driver decodes its
/// text columns as `String` (SQLite's `TEXT`, PostgreSQL's `text`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! decoded_text {
    () => {
        fn text(row: &Self::Row, column: &str) -> $crate::error::Result<String> {
            sqlx::Row::try_get(row, column).map_err(Self::map_err)
        }
        fn opt_text(row: &Self::Row, column: &str) -> $crate::error::Result<Option<String>> {
            sqlx::Row::try_get(row, column).map_err(Self::map_err)
        }
    };
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use decoded_text;

/// How many times [`retrying`] runs a transaction again after a lock conflict.
pub(crate) const LOCK_CONFLICT_RETRIES: u32 = 5;

/// Run a whole transaction, again when it lost a lock conflict ([`Dialect::is_lock_conflict`])
/// after a jittered, doubling pause, up to [`LOCK_CONFLICT_RETRIES`] times. `transaction`
/// begins and commits its own transaction: a deadlock rolls back all of it, and after a
/// lock-wait timeout (which rolls back only the statement) the dropped transaction
/// rolls back the rest. Where the backend loses no conflicts it runs once.
pub(crate) async fn retrying<D, T, F, Fut>(mut transaction: F) -> Result<T>
where
    D: Dialect,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut retries = 0;
    loop {
        match transaction().await {
            Err(err) if retries < LOCK_CONFLICT_RETRIES && D::is_lock_conflict(&err) => {
                retries += 1;
                let pause = backoff(retries);
                tracing::debug!(%err, retries, ?pause, "lock conflict; transaction run again");
                tokio::time::sleep(pause).await;
            }
            result => return result,
        }
    }
}

/// Between half and all of 10 ms × 2^(retry - 1), so that colliding transactions do not
/// collide again.
pub(crate) fn backoff(retry: u32) -> std::time::Duration {
    use std::hash::BuildHasher;

    let ceiling_us = 10_000u64 << retry.saturating_sub(1).min(10);
    // A fresh `RandomState` is randomly keyed: hashing anything with it is a cheap
    // random number, without another dependency.
    let random = std::collections::hash_map::RandomState::new().hash_one(retry);
    std::time::Duration::from_micros(ceiling_us / 2 + random % (ceiling_us / 2 + 1))
}

/// Commit `tx` if `accept` takes `outcomes`, else roll it back: how every backend's
/// `task_insert_many_if` ends. The caller wakes its workers if a committed task is new.
pub(crate) async fn commit_if_accepted<D: Dialect>(
    tx: sqlx::Transaction<'static, D>,
    outcomes: Vec<TaskInsertOutcome>,
    accept: &InsertAccept<'_>,
) -> Result<TaskInsertManyChecked> {
    let committed = accept(&outcomes);
    if committed {
        tx.commit().await.map_err(D::map_err)?;
    } else {
        tx.rollback().await.map_err(D::map_err)?;
    }
    Ok(TaskInsertManyChecked {
        outcomes,
        committed,
    })
}

/// Whether a committed insert made a new task, so that the inserting process wakes its
/// own workers.
pub(crate) fn woke_by(checked: &TaskInsertManyChecked) -> bool {
    checked.committed && checked.outcomes.iter().any(TaskInsertOutcome::created)
}

/// `sql` in `D`'s placeholders: each `?` outside a quoted literal becomes `$1`, `$2`,
/// ... where they are numbered, else the text is returned as it is.
///
/// # Panics
///
/// On text outside the limits of [`sql!`](crate::dialect::sql), in every dialect (so
/// that a build with one backend refuses what another could not take): the text is a
/// constant of this crate, so the first test run that renders it finds the mistake.
pub(crate) fn placeholders<D: Dialect>(sql: String) -> String {
    number_placeholders(&sql, D::NUMBERED).unwrap_or(sql)
}

/// `sql` with its `?` numbered (`$1`, `$2`, ...) when `numbered`, else `None` (the text
/// is right as it is); checked against the limits of [`sql!`](crate::dialect::sql)
/// either way.
fn number_placeholders(sql: &str, numbered: bool) -> Option<String> {
    let refuse =
        |what: &str| -> ! { panic!("shared SQL may not hold {what} (see `dialect::sql!`): {sql}") };
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    let mut quoted = false;
    for (i, &c) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1).copied();
        if quoted {
            // `''` inside a literal closes it and opens it again: the toggle holds.
            if c == '\'' {
                quoted = false;
            }
            out.push(c);
            continue;
        }
        match c {
            '\'' => {
                // `E'`, `B'`, `X'`, `N'`, `U&'`: a prefixed literal, whose escapes the
                // scan does not follow.
                if prev.is_some_and(|p| p.is_alphanumeric() || p == '_' || p == '&') {
                    refuse("a prefixed string literal (E'...', U&'...')");
                }
                quoted = true;
                out.push(c);
            }
            '"' => refuse("a double-quoted identifier"),
            '$' => refuse("`$` (dollar quoting, or a placeholder already numbered)"),
            '-' if next == Some('-') => refuse("a `--` comment"),
            '/' if next == Some('*') => refuse("a `/* */` comment"),
            '?' => {
                // PostgreSQL's operators spelled with `?` (`?|`, `?&`, `?-`, `?-|`, `?#`,
                // `?||`), and the jsonb `?` before a key (`data ? 'key'`), where a
                // placeholder could not stand.
                if next.is_some_and(|c| matches!(c, '|' | '&' | '-' | '#')) {
                    refuse("a PostgreSQL `?` operator (`?|`, `?&`, `?-`, `?#`)");
                }
                let after = chars[i + 1..].iter().find(|c| !c.is_whitespace());
                if matches!(after, Some('\'' | '?')) {
                    refuse("a `?` before a literal or another `?` (the jsonb `?` operator)");
                }
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    if quoted {
        refuse("an unterminated string literal");
    }
    numbered.then_some(out)
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
///
/// The text goes through `format!`, so a literal `{` or `}` is written `{{` or `}}`.
///
/// The rewrite knows only `?` placeholders and single-quoted literals (where `''` is a
/// quote and nothing is a placeholder), so the text may hold no `?` operator
/// (PostgreSQL's jsonb `?`, `?|`, `?&`: call `jsonb_exists`, `jsonb_exists_any`,
/// `jsonb_exists_all` instead), no comment (`--`, `/* */`), no double-quoted
/// identifier, no `$` (dollar quoting, or a placeholder numbered by hand), and no
/// prefixed literal (`E'...'`, `U&'...'`). Rendering such text panics, naming what it
/// found, on every backend: a `?` directly followed by `|`, `&`, `-` or `#` (write
/// `? - 1`), or followed by a literal or another `?`, is taken for an operator. What
/// the scan cannot tell from a placeholder (a jsonb `?` between two column names) it
/// numbers, and the statement then misses a bound value.
macro_rules! sql {
    ($db:ty, $($format:tt)+) => {{
        static SQL: ::std::sync::LazyLock<String> = ::std::sync::LazyLock::new(|| {
            $crate::dialect::placeholders::<$db>(format!($($format)+))
        });
        SQL.as_str()
    }};
}
pub(crate) use sql;

#[cfg(test)]
mod tests {
    use super::number_placeholders;

    #[test]
    fn placeholders_are_numbered_outside_quotes_only() {
        let sql = "UPDATE t SET a = ?, b = '?', c = 'it''s ?' WHERE d = ? AND e = ?";
        assert_eq!(
            number_placeholders(sql, true).as_deref(),
            Some("UPDATE t SET a = $1, b = '?', c = 'it''s ?' WHERE d = $2 AND e = $3")
        );
        assert_eq!(number_placeholders(sql, false), None);
        let harmless = "SELECT a FROM t WHERE b = '--\"$$/*' AND c = ? || 'x' AND d - 1 > ?";
        assert_eq!(
            number_placeholders(harmless, true).as_deref(),
            Some("SELECT a FROM t WHERE b = '--\"$$/*' AND c = $1 || 'x' AND d - 1 > $2")
        );
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_numbers_its_placeholders() {
        let sql = "UPDATE t SET a = ?, b = '?' WHERE c = ?".to_owned();
        assert_eq!(
            super::placeholders::<sqlx::Postgres>(sql),
            "UPDATE t SET a = $1, b = '?' WHERE c = $2"
        );
    }

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_takes_its_placeholders_as_written() {
        let sql = "UPDATE t SET a = ?, b = '?' WHERE c = ?".to_owned();
        assert_eq!(super::placeholders::<sqlx::Sqlite>(sql.clone()), sql);
    }

    /// Refused in every dialect, numbered or not.
    fn refused(sql: &str) {
        number_placeholders(sql, false);
    }

    #[test]
    #[should_panic(expected = "double-quoted identifier")]
    fn a_double_quoted_identifier_is_refused() {
        refused(r#"SELECT "a?" FROM t WHERE b = ?"#);
    }

    #[test]
    #[should_panic(expected = "dollar quoting")]
    fn dollar_quoting_is_refused() {
        refused("SELECT $$a ? b$$ WHERE c = ?");
    }

    #[test]
    #[should_panic(expected = "dollar quoting")]
    fn a_numbered_placeholder_is_refused() {
        refused("SELECT a FROM t WHERE b = $1");
    }

    #[test]
    #[should_panic(expected = "`--` comment")]
    fn a_line_comment_is_refused() {
        refused("SELECT a FROM t -- b = ?\nWHERE c = ?");
    }

    #[test]
    #[should_panic(expected = "`/* */` comment")]
    fn a_block_comment_is_refused() {
        refused("SELECT a /* ? */ FROM t WHERE c = ?");
    }

    #[test]
    #[should_panic(expected = "prefixed string literal")]
    fn an_escape_string_is_refused() {
        refused(r"SELECT a FROM t WHERE b = E'\'?' AND c = ?");
    }

    #[test]
    #[should_panic(expected = "prefixed string literal")]
    fn a_unicode_string_is_refused() {
        refused("SELECT a FROM t WHERE b = U&'?' AND c = ?");
    }

    #[test]
    #[should_panic(expected = "PostgreSQL `?` operator")]
    fn the_any_key_operator_is_refused() {
        refused("SELECT a FROM t WHERE data ?| ARRAY['k'] AND c = ?");
    }

    #[test]
    #[should_panic(expected = "PostgreSQL `?` operator")]
    fn the_all_keys_operator_is_refused() {
        refused("SELECT a FROM t WHERE data ?& ARRAY['k'] AND c = ?");
    }

    #[test]
    #[should_panic(expected = "jsonb `?` operator")]
    fn the_key_operator_before_a_literal_is_refused() {
        refused("SELECT a FROM t WHERE data ? 'k' AND c = ?");
    }

    #[test]
    #[should_panic(expected = "jsonb `?` operator")]
    fn the_key_operator_before_a_placeholder_is_refused() {
        refused("SELECT a FROM t WHERE data ? ? AND c = ?");
    }

    #[test]
    #[should_panic(expected = "unterminated string literal")]
    fn an_unterminated_literal_is_refused() {
        refused("SELECT a FROM t WHERE b = 'x AND c = ?");
    }
}
