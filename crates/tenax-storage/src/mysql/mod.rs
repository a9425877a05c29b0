//! The MariaDB/MySQL backend. Tested on MariaDB 10.11; the SQL avoids what MySQL 8
//! lacks where that costs nothing, but only MariaDB is tested.
//!
//! - InnoDB, sessions in READ COMMITTED: a locking read sees the latest committed row
//!   and non-matching rows are not kept locked. Writes therefore need a binary log in
//!   `ROW` or `MIXED` format (MariaDB's default is `MIXED`), if the binary log is on.
//! - No `UPDATE ... RETURNING` (MariaDB has none): a state change locks its rows with
//!   `SELECT ... FOR UPDATE`, checks them, writes them by id with the same conditions
//!   repeated, and reads them back, all in one transaction.
//! - Locks are taken only on rows a call may change: the claim, the reaper and the
//!   pruner lock with `SKIP LOCKED` (concurrent workers take different tasks) and read
//!   one status (and queue) at a time in index order, so that no sort makes InnoDB lock
//!   every candidate row; every other locking read goes through the primary or a
//!   unique key, so no call waits for a task it does not touch.
//! - Deadlocks (1213) and lock-wait timeouts (1205) are normal under claim contention in
//!   InnoDB: the whole transaction is retried inside the backend a few times with
//!   jittered backoff (`retrying`) before the error is returned as
//!   [`StorageError::Transient`]. Sessions wait at most `innodb_lock_wait_timeout`
//!   (10 s by default) for a row lock, so a stuck lock is noticed.
//! - Times are `DATETIME(6)` holding UTC, taken from the database clock
//!   (`UTC_TIMESTAMP(6)`) inside the transaction that uses them; sessions run with
//!   `time_zone = '+00:00'`. Derived times (`now + delay`) are computed in Rust from
//!   that value, so they are exact to the microsecond.
//! - Wake-ups reach other processes through a probe (`crate::wake`): a connection of
//!   its own reads the newest task id (`SELECT MAX(id)`, the last entry of the primary
//!   key) every [`MySqlConfig::wake_poll_interval`], so another process's enqueue wakes
//!   this one's workers. A retry, redrive or resumed queue of another process is seen
//!   at the next poll; so is, rarely, an insert whose transaction commits after one
//!   with a higher id was seen.
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::{ConnectOptions, Connection, Executor, MySql, QueryBuilder, Transaction};
use tenax_core::{AttemptRecord, InvalidInput, TaskId, TaskRecord};

use crate::common::truncate_error;
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

use errors::*;

mod actions;
mod alert_state;
mod audit;
mod bulk;
mod claim;
mod databases;
mod errors;
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
mod time;
mod transactional;
mod workflows;

#[cfg(feature = "testing")]
pub use databases::testing_database;
pub use databases::{recreate_database, url_with_database};
pub use insert::{enqueue_in, enqueue_many_in};
use rows::{task_from_row, TASK_COLUMNS};
use time::{clock, datetime_range, minus, plus, storable, DbTime};
pub use transactional::{Transactional, TransactionalCommand};
pub use workflows::enqueue_workflow_in;

/// The migrations of this backend. A database that records migrations this binary
/// does not know (a newer node migrated it) is accepted: migrations are additive, so
/// nodes of the previous version keep running, restarting and rolling back during a
/// rolling deploy.
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("./migrations/mysql");
    migrator.set_ignore_missing(true);
    migrator
}

/// The statuses a claim takes tasks from.
const CLAIMABLE: [&str; 2] = ["pending", "retrying"];
/// The statuses a prune deletes.
const FINISHED: [&str; 3] = ["succeeded", "dead", "cancelled"];

/// Options of the MariaDB/MySQL backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MySqlConfig {
    /// Pooled connections. Defaults to 10. The heartbeat (lease renewals and its
    /// question about cancel requests) has one more of its own, opened at the first
    /// beat, which nothing else takes: a pool held by handlers, claims and completions
    /// never delays a heartbeat.
    pub max_connections: u32,
    /// How long a call waits for a pooled connection. Defaults to 10 seconds.
    pub acquire_timeout: Duration,
    /// How long a statement waits for a row lock (`innodb_lock_wait_timeout`, whole
    /// seconds, at least 1). Defaults to 10 seconds.
    pub lock_wait_timeout: Duration,
    /// How often a connection of its own reads the newest task id to wake this
    /// process's workers when another process has enqueued, once a worker listens.
    /// Defaults to [`DEFAULT_WAKE_POLL_INTERVAL`] (25 ms); `None` keeps wake-ups within
    /// the process, and other processes' tasks wait for the workers' poll. The URL
    /// parameter `wake_poll_ms` overrides it (`0` for `None`).
    pub wake_poll_interval: Option<Duration>,
}

impl Default for MySqlConfig {
    fn default() -> Self {
        Self {
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            lock_wait_timeout: Duration::from_secs(10),
            wake_poll_interval: Some(DEFAULT_WAKE_POLL_INTERVAL),
        }
    }
}

/// Tenax on a MariaDB (or MySQL) database.
#[derive(Debug, Clone)]
pub struct MySqlStorage {
    pool: MySqlPool,
    /// Lease renewals' own connection (see [`MySqlConfig::max_connections`]), which
    /// also asks the heartbeat's question about cancel requests.
    leases: MySqlPool,
    wake: Arc<Wake>,
}

/// The cross-process probe: the newest task id, read from the end of the primary key
/// (no row is locked, no enqueue waits for it). It changes when any process commits an
/// insert, and when the newest tasks are pruned.
struct NewestTask(MySqlConnectOptions);

#[async_trait]
impl Probe for NewestTask {
    type Conn = MySqlConnection;

    async fn connect(&self) -> Result<MySqlConnection> {
        self.0.connect().await.map_err(map_err)
    }

    async fn read(&self, conn: &mut MySqlConnection) -> Result<i64> {
        let newest: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM tenax_tasks")
            .fetch_one(conn)
            .await
            .map_err(map_err)?;
        Ok(newest.unwrap_or(0))
    }

    async fn close(&self, conn: MySqlConnection) {
        if let Err(e) = conn.close().await {
            tracing::debug!(error = %e, "closing the wake-up probe's connection");
        }
    }
}

/// Parse a `mysql://` or `mariadb://` URL (sqlx knows only the former).
fn options_from_url(url: &str) -> Result<MySqlConnectOptions> {
    let url = match url.strip_prefix("mariadb:") {
        Some(rest) => format!("mysql:{rest}"),
        None => url.to_owned(),
    };
    MySqlConnectOptions::from_str(&url)
        .map_err(|e| InvalidInput::new("database URL", e.to_string()).into())
}

impl MySqlStorage {
    /// Connect to the database a `mysql://` or `mariadb://` URL names, with defaults.
    /// Does not migrate: call [`Storage::migrate`](crate::Storage::migrate), or use [`crate::connect`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_with(url, &MySqlConfig::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &str, config: &MySqlConfig) -> Result<Self> {
        let (url, wake_poll) = take_wake_poll(url)?;
        let mut config = config.clone();
        if let Some(interval) = wake_poll {
            config.wake_poll_interval = interval;
        }
        Self::connect_options(options_from_url(&url)?, &config).await
    }

    async fn connect_options(options: MySqlConnectOptions, config: &MySqlConfig) -> Result<Self> {
        let lock_wait_secs = config.lock_wait_timeout.as_secs().max(1);
        let pool_options = |acquire_timeout| {
            crate::pool::options::<sqlx::MySql>()
                .acquire_timeout(acquire_timeout)
                .after_connect(move |conn, _meta| {
                    Box::pin(async move {
                        // READ COMMITTED: locking reads see the latest committed rows,
                        // and the claim's SKIP LOCKED does not keep gap locks.
                        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .await?;
                        // UTC, whatever the URL or the server says: sqlx encodes and
                        // decodes DATETIME as UTC.
                        conn.execute(
                            format!(
                                "SET time_zone = '+00:00', \
                                 SESSION innodb_lock_wait_timeout = {lock_wait_secs}"
                            )
                            .as_str(),
                        )
                        .await?;
                        Ok(())
                    })
                })
        };
        let pool = pool_options(config.acquire_timeout)
            .max_connections(config.max_connections.max(1))
            .connect_with(options.clone())
            .await
            .map_err(map_err)?;
        let leases = pool_options(
            config
                .acquire_timeout
                .min(crate::pool::LEASE_ACQUIRE_TIMEOUT),
        )
        .max_connections(1)
        .connect_lazy_with(options.clone());
        let wake = Wake::probed(NewestTask(options), config.wake_poll_interval);
        Ok(Self { pool, leases, wake })
    }

    /// The connection pool, for callers that share the database (and for tests that
    /// check its settings).
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>> {
        self.pool.begin().await.map_err(map_err)
    }
}

crate::shared::storage::probed_storage!(
    MySqlStorage,
    "its waits are bounded by `innodb_lock_wait_timeout` and the pool's acquire timeout."
);

/// Append `(?, ?, ...)` binding `items`; the caller makes sure there is at least one.
fn push_list<'args, T>(qb: &mut QueryBuilder<'args, MySql>, items: impl IntoIterator<Item = T>)
where
    T: 'args + sqlx::Encode<'args, MySql> + sqlx::Type<MySql>,
{
    qb.push("(");
    let mut list = qb.separated(", ");
    for item in items {
        list.push_bind(item);
    }
    qb.push(")");
}

crate::shared::tasks::task_reads!(MySql);

/// A task that must exist (it was just written in this transaction).
async fn fetch_id(tx: &mut Transaction<'static, MySql>, id: TaskId) -> Result<TaskRecord> {
    fetch_ref(&mut **tx, &TaskRef::Id(id))
        .await?
        .ok_or_else(|| StorageError::NotFound(TaskRef::Id(id).to_string()))
}

/// Tasks by id, in id order.
async fn fetch_ids(tx: &mut Transaction<'static, MySql>, ids: &[i64]) -> Result<Vec<TaskRecord>> {
    let mut qb = QueryBuilder::new(format!(
        "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id IN "
    ));
    push_list(&mut qb, ids.iter().copied());
    qb.push(" ORDER BY id");
    let rows = qb.build().fetch_all(&mut **tx).await.map_err(map_err)?;
    rows.iter().map(task_from_row).collect()
}

// One attempt each; the shared forwarders run them again after a lock conflict.
crate::shared::insert::insert_transactions!(MySqlStorage);
