//! The SQLite backend: the embedded default.
//!
//! - WAL journal with `synchronous=FULL` by default, so an acknowledged enqueue survives
//!   power loss. [`Synchronous::Normal`] is faster and may lose the last commits on
//!   power loss (never on a process crash); it is only used when chosen explicitly.
//! - Every write is one `BEGIN IMMEDIATE` transaction: SQLite takes the write lock at
//!   the start, so a transaction never has to upgrade a read snapshot (which fails with
//!   `SQLITE_BUSY_SNAPSHOT` and is not retried by the busy handler). A storage runs its
//!   write transactions on one connection of their own, so its writers queue in memory
//!   and in order; writers of other processes queue on the `busy_timeout`.
//! - Times are INTEGER milliseconds since the Unix epoch, UTC, taken from SQLite's clock
//!   (`unixepoch('subsec')`) inside the transaction that uses them.
//! - Wake-ups reach other processes through a probe (`crate::wake`): a connection of
//!   its own reads `PRAGMA data_version`, which changes when another connection
//!   commits, every [`SqliteConfig::wake_poll_interval`].
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Sqlite, Transaction};
use tenax_core::{AttemptRecord, InvalidInput, TaskId, TaskRecord, TaskStatus};

use crate::common::{duration_ms, json_list};
use crate::error::{Result, StorageError};
use crate::outbox::{
    OutboxClaimParams, OutboxListParams, OutboxPruneParams, OutboxRecord, OutboxSettleParams,
};
use crate::params::*;
use crate::wake::{take_wake_poll, Probe, Wake, DEFAULT_WAKE_POLL_INTERVAL};
use crate::workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowListParams,
    WorkflowRecord,
};

mod actions;
mod alert_state;
mod audit;
mod bulk;
mod claim;
mod events;
mod insert;
mod keys;
mod outbox;
mod outcomes;
mod prune;
mod queue_stats;
mod queues;
mod rates;
mod rows;
mod runtime;
mod schedules;
mod storage;
mod transactional;
mod workflows;

pub use insert::{enqueue_in, enqueue_many_in};
use rows::{ms, task_from_row, TASK_COLUMNS};
pub use transactional::{Transactional, TransactionalCommand};
pub use workflows::enqueue_workflow_in;

const NOW_MS: &str = "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)";
/// `tenax_core::PRIORITY_AGING_STEP` in ms, as written in the index
/// `tenax_tasks_claim_key` (the claim must name the same expression to use it).
const STEP_MS: i64 = 60_000;
const _: () = assert!(STEP_MS as u128 == tenax_core::PRIORITY_AGING_STEP.as_millis());

/// The migrations of this backend. A database that records migrations this binary
/// does not know (a newer node migrated it) is accepted: migrations are additive, so
/// nodes of the previous version keep running, restarting and rolling back during a
/// rolling deploy.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/sqlite");
    migrator.set_ignore_missing(true);
    migrator
}

/// SQLite's `synchronous` setting for the WAL journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is fsynced: an acknowledged write survives power loss. The default.
    #[default]
    Full,
    /// Commits are fsynced at checkpoints: faster, and the last commits may be lost on
    /// power loss (not on a process crash).
    Normal,
}

/// Options of the SQLite backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteConfig {
    /// Durability of commits. Defaults to [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long a writer waits for the write lock held by another process (or by a
    /// connection of [`SqliteStorage::pool`]). Defaults to 10 seconds. This storage's
    /// own write transactions queue for its writer connection first, for at most this
    /// long plus 5 seconds.
    pub busy_timeout: Duration,
    /// Pooled connections for reads and for callers of [`SqliteStorage::pool`].
    /// Defaults to 8. Write transactions take one more connection of their own.
    pub max_connections: u32,
    /// How often a connection of its own reads `PRAGMA data_version` to wake this
    /// process's workers when another process (or connection) has committed, once a
    /// worker listens. Defaults to [`DEFAULT_WAKE_POLL_INTERVAL`] (25 ms); `None` keeps
    /// wake-ups within the process, and other processes' tasks wait for the workers'
    /// poll. The URL parameter `wake_poll_ms` overrides it (`0` for `None`).
    pub wake_poll_interval: Option<Duration>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(10),
            max_connections: 8,
            wake_poll_interval: Some(DEFAULT_WAKE_POLL_INTERVAL),
        }
    }
}

/// Tenax on a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    pool: SqlitePool,
    /// One connection for this process's write transactions: its writers queue for it
    /// in memory, in order, instead of on SQLite's busy handler, which polls the lock
    /// with sleeps of 1 ms and more and leaves it idle between them.
    writer: SqlitePool,
    wake: Arc<Wake>,
}

/// The cross-process probe: `PRAGMA data_version` on a connection of its own changes
/// whenever another connection (of any process) has committed to the file.
struct DataVersion(SqliteConnectOptions);

#[async_trait]
impl Probe for DataVersion {
    type Conn = SqliteConnection;

    async fn connect(&self) -> Result<SqliteConnection> {
        self.0.connect().await.map_err(map_err)
    }

    async fn read(&self, conn: &mut SqliteConnection) -> Result<i64> {
        sqlx::query_scalar("PRAGMA data_version")
            .fetch_one(conn)
            .await
            .map_err(map_err)
    }

    async fn close(&self, conn: SqliteConnection) {
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing the wake-up probe's connection");
        }
    }
}

impl SqliteStorage {
    /// Open (creating if missing) the file a `sqlite://PATH` URL names, with defaults.
    /// Does not migrate: call [`Storage::migrate`](crate::Storage::migrate), or use [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &SqliteConfig::default()).await
    }

    /// Open with explicit options.
    pub async fn connect_with(url: &str, config: &SqliteConfig) -> Result<Self> {
        let (url, wake_poll) = take_wake_poll(url)?;
        let url = url.as_str();
        let wake_poll_interval = wake_poll.unwrap_or(config.wake_poll_interval);
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(InvalidInput::new(
                "database URL",
                "an in-memory SQLite database is private to one connection; use a file",
            )
            .into());
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| InvalidInput::new("database URL", e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match config.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(config.busy_timeout)
            .foreign_keys(true);
        let pool = crate::pool::options()
            .max_connections(config.max_connections.max(1))
            .acquire_timeout(config.busy_timeout + Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let writer = crate::pool::options()
            .max_connections(1)
            .acquire_timeout(config.busy_timeout + Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let wake = Wake::probed(DataVersion(options), wake_poll_interval);
        Ok(Self { pool, writer, wake })
    }

    /// The connection pool, for callers that share the database (and for tests that
    /// check its settings).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>> {
        self.writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)
    }
}

crate::shared::storage::probed_storage!(SqliteStorage, "its waits are bounded by `busy_timeout`.");

/// The database clock, or the caller's override, in milliseconds.
async fn clock(tx: &mut Transaction<'static, Sqlite>, now: Option<DateTime<Utc>>) -> Result<i64> {
    match now {
        Some(now) => Ok(now.timestamp_millis()),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(&mut **tx)
            .await
            .map_err(map_err),
    }
}

/// The database clock, or the caller's override, in milliseconds, outside a transaction.
async fn clock_now(pool: &SqlitePool, now: Option<DateTime<Utc>>) -> Result<i64> {
    match now {
        Some(now) => Ok(now.timestamp_millis()),
        None => sqlx::query_scalar(NOW_MS)
            .fetch_one(pool)
            .await
            .map_err(map_err),
    }
}

/// Map a sqlx error to the normalised kinds.
pub(crate) fn map_err(err: sqlx::Error) -> StorageError {
    match &err {
        sqlx::Error::Database(db) => {
            // Primary result codes: SQLITE_BUSY (5, incl. BUSY_SNAPSHOT 517),
            // SQLITE_LOCKED (6).
            let code = db
                .code()
                .and_then(|c| c.parse::<i64>().ok())
                .map(|c| c & 0xff);
            if matches!(code, Some(5 | 6)) {
                StorageError::Transient(Box::new(err))
            } else {
                StorageError::Database(Box::new(err))
            }
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StorageError::Transient(Box::new(err))
        }
        _ => StorageError::Database(Box::new(err)),
    }
}

crate::shared::tasks::task_reads!(Sqlite);

crate::shared::insert::insert_transactions!(SqliteStorage);
