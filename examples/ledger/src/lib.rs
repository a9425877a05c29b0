//! A ledger posting made exactly-once by transactional completion.
//!
//! [`PostEntry`] inserts one row into `ledger_entries`, a table in the database Tenax
//! itself uses, inside the transaction that marks its task succeeded. A worker that
//! crashes, loses its lease or fails before that transaction commits leaves nothing
//! behind, and the task's next attempt posts the entry; once it commits, the task is
//! succeeded and never runs again. So every task posts exactly one row, without a
//! unique key or an idempotency check on the ledger (a production table would still
//! add one, as a second line of defence).
//!
//! The same command runs on each backend through that backend's
//! `TransactionalCommand` trait; [`Backend`] picks one from the database URL.
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tenax::sqlx::{self, Row};
use tenax::storage::Storage;
use tenax::{CommandError, Registry, RegistryError, TaskContext};

/// The command's stable type name.
pub const POST_ENTRY: &str = "LEDGER_POST_ENTRY";

/// One posting: `amount_cents` (negative for a debit) on `account`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The account posted to.
    pub account: String,
    /// Signed amount in cents.
    pub amount_cents: i64,
}

/// Posts an [`Entry`] to `ledger_entries` in the transaction that completes its task;
/// its result is the account's balance after the posting.
#[derive(Debug, Clone, Default)]
pub struct PostEntry {
    /// How long to stay inside the open transaction after the insert (zero in real
    /// use; crash tests widen the window in which a kill lands mid-transaction).
    pub hold: Duration,
}

fn db_error(e: sqlx::Error) -> CommandError {
    CommandError::retryable(format!("ledger write failed: {e}"))
}

async fn pause(hold: Duration) {
    if !hold.is_zero() {
        tokio::time::sleep(hold).await;
    }
}

impl tenax::sqlite::TransactionalCommand for PostEntry {
    const TYPE: &'static str = POST_ENTRY;
    type Context = Entry;
    type Output = i64;

    async fn execute_in(
        &self,
        entry: Entry,
        task: &TaskContext,
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    ) -> Result<i64, CommandError> {
        sqlx::query(
            "INSERT INTO ledger_entries (task_no, epoch, account, amount_cents) VALUES (?, ?, ?, ?)",
        )
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(&entry.account)
        .bind(entry.amount_cents)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
        pause(self.hold).await;
        sqlx::query_scalar(
            "SELECT COALESCE(SUM(amount_cents), 0) FROM ledger_entries WHERE account = ?",
        )
        .bind(&entry.account)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)
    }
}

impl tenax::postgres::TransactionalCommand for PostEntry {
    const TYPE: &'static str = POST_ENTRY;
    type Context = Entry;
    type Output = i64;

    async fn execute_in(
        &self,
        entry: Entry,
        task: &TaskContext,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    ) -> Result<i64, CommandError> {
        sqlx::query(
            "INSERT INTO ledger_entries (task_no, epoch, account, amount_cents)
             VALUES ($1, $2, $3, $4)",
        )
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(&entry.account)
        .bind(entry.amount_cents)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
        pause(self.hold).await;
        sqlx::query_scalar(
            "SELECT COALESCE(SUM(amount_cents), 0)::BIGINT FROM ledger_entries WHERE account = $1",
        )
        .bind(&entry.account)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)
    }
}

impl tenax::mysql::TransactionalCommand for PostEntry {
    const TYPE: &'static str = POST_ENTRY;
    type Context = Entry;
    type Output = i64;

    async fn execute_in(
        &self,
        entry: Entry,
        task: &TaskContext,
        tx: &mut sqlx::Transaction<'static, sqlx::MySql>,
    ) -> Result<i64, CommandError> {
        sqlx::query(
            "INSERT INTO ledger_entries (task_no, epoch, account, amount_cents) VALUES (?, ?, ?, ?)",
        )
        .bind(task.task_no().as_str())
        .bind(task.lease_epoch())
        .bind(&entry.account)
        .bind(entry.amount_cents)
        .execute(&mut **tx)
        .await
        .map_err(db_error)?;
        pause(self.hold).await;
        sqlx::query_scalar(
            "SELECT CAST(COALESCE(SUM(amount_cents), 0) AS SIGNED) FROM ledger_entries WHERE account = ?",
        )
        .bind(&entry.account)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_error)
    }
}

/// The command as the client enqueues it. Each backend's adapter declares the same
/// type name and defaults, so any of them names the task; the worker runs it through
/// the adapter of its own backend ([`Backend::registry`]).
pub type Enqueued = tenax::sqlite::Transactional<PostEntry>;

/// The database Tenax and the ledger share, opened from its URL.
#[derive(Debug, Clone)]
pub enum Backend {
    /// `sqlite://PATH`
    Sqlite(Arc<tenax::sqlite::SqliteStorage>),
    /// `postgres://...[?schema=NAME]`
    Postgres(Arc<tenax::postgres::PgStorage>),
    /// `mysql://...` or `mariadb://...`
    MySql(Arc<tenax::mysql::MySqlStorage>),
}

/// What can go wrong opening the database.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Backend {
    /// Connect, migrate Tenax's tables and create the ledger table if missing.
    pub async fn open(url: &str) -> Result<Self, BoxError> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        let backend = match scheme {
            "sqlite" => Self::Sqlite(Arc::new(tenax::sqlite::SqliteStorage::connect(url).await?)),
            "postgres" | "postgresql" => {
                Self::Postgres(Arc::new(tenax::postgres::PgStorage::connect(url).await?))
            }
            "mysql" | "mariadb" => {
                Self::MySql(Arc::new(tenax::mysql::MySqlStorage::connect(url).await?))
            }
            _ => return Err(format!("unsupported database URL {url:?}").into()),
        };
        let storage = backend.storage();
        storage.migrate().await?;
        match &backend {
            Self::Sqlite(s) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS ledger_entries (
                         id INTEGER PRIMARY KEY AUTOINCREMENT,
                         task_no TEXT NOT NULL, epoch INTEGER NOT NULL,
                         account TEXT NOT NULL, amount_cents INTEGER NOT NULL)",
                )
                .execute(s.pool())
                .await?;
            }
            Self::Postgres(s) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS ledger_entries (
                         id BIGSERIAL PRIMARY KEY,
                         task_no TEXT NOT NULL, epoch BIGINT NOT NULL,
                         account TEXT NOT NULL, amount_cents BIGINT NOT NULL)",
                )
                .execute(s.pool())
                .await?;
            }
            Self::MySql(s) => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS ledger_entries (
                         id BIGINT AUTO_INCREMENT PRIMARY KEY,
                         task_no VARCHAR(128) NOT NULL, epoch BIGINT NOT NULL,
                         account VARCHAR(128) NOT NULL, amount_cents BIGINT NOT NULL)
                     ENGINE = InnoDB CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                )
                .execute(s.pool())
                .await?;
            }
        }
        Ok(backend)
    }

    /// The storage the worker and the client use (the same instance the adapter
    /// completes through).
    pub fn storage(&self) -> Arc<dyn Storage> {
        match self {
            Self::Sqlite(s) => s.clone(),
            Self::Postgres(s) => s.clone(),
            Self::MySql(s) => s.clone(),
        }
    }

    /// A registry running `command` transactionally on this backend.
    pub fn registry(&self, command: PostEntry) -> Result<Registry, RegistryError> {
        let mut registry = Registry::new();
        match self {
            Self::Sqlite(s) => {
                registry.register(tenax::sqlite::Transactional::new(command, s.clone()))?
            }
            Self::Postgres(s) => {
                registry.register(tenax::postgres::Transactional::new(command, s.clone()))?
            }
            Self::MySql(s) => {
                registry.register(tenax::mysql::Transactional::new(command, s.clone()))?
            }
        };
        Ok(registry)
    }

    /// Every ledger row as `(task_no, epoch)`, in insertion order.
    pub async fn ledger(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        const SELECT: &str = "SELECT task_no, epoch FROM ledger_entries ORDER BY id";
        match self {
            Self::Sqlite(s) => sqlx::query(SELECT).fetch_all(s.pool()).await?.iter().map(pair).collect(),
            Self::Postgres(s) => sqlx::query(SELECT).fetch_all(s.pool()).await?.iter().map(pair).collect(),
            // A binary collation reads as bytes; convert to text.
            Self::MySql(s) => sqlx::query(
                "SELECT CONVERT(task_no USING utf8mb4) AS task_no, epoch FROM ledger_entries ORDER BY id",
            )
            .fetch_all(s.pool())
            .await?
            .iter()
            .map(pair)
            .collect(),
        }
    }
}

fn pair<R: Row>(row: &R) -> Result<(String, i64), sqlx::Error>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
{
    Ok((row.try_get("task_no")?, row.try_get("epoch")?))
}
