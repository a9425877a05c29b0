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
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlExecutor, MySqlPool};
use sqlx::{ConnectOptions, Connection, Executor, MySql, QueryBuilder, Row, Transaction};
use tenax_core::{AttemptRecord, InvalidInput, TaskId, TaskRecord, TaskStatus};

use crate::common::{offers_nothing, truncate_error, validate_insert};
use crate::error::{Result, StorageError};
use crate::flow;
use crate::outbox::{
    OutboxClaimParams, OutboxListParams, OutboxPruneParams, OutboxRecord, OutboxSettleParams,
};
use crate::params::*;
use crate::wake::{take_wake_poll, Probe, Wake, DEFAULT_WAKE_POLL_INTERVAL};
use crate::workflows::{
    ParentOutcome, WorkflowDetail, WorkflowId, WorkflowInsertParams, WorkflowListParams,
    WorkflowRecord,
};
use crate::{Capabilities, Storage, WakeReceiver};

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
    /// Does not migrate: call [`Storage::migrate`], or use [`crate::connect`].
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

    fn wake(&self) {
        self.wake.bump();
    }

    async fn begin(&self) -> Result<Transaction<'static, MySql>> {
        self.pool.begin().await.map_err(map_err)
    }
}

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

/// Whether a task is locked (`SELECT ... FOR UPDATE`) when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    No,
    ForUpdate,
}

impl Lock {
    fn clause(self) -> &'static str {
        match self {
            Lock::No => "",
            Lock::ForUpdate => " FOR UPDATE",
        }
    }
}

async fn fetch_ref(
    executor: impl MySqlExecutor<'_>,
    task: &TaskRef,
    lock: Lock,
) -> Result<Option<TaskRecord>> {
    let lock = lock.clause();
    let row = match task {
        TaskRef::Id(id) => {
            sqlx::query(&format!(
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE id = ?{lock}"
            ))
            .bind(id.0)
            .fetch_optional(executor)
            .await
        }
        TaskRef::No(no) => {
            sqlx::query(&format!(
                "SELECT {TASK_COLUMNS} FROM tenax_tasks WHERE task_no = ?{lock}"
            ))
            .bind(no.as_str())
            .fetch_optional(executor)
            .await
        }
    }
    .map_err(map_err)?;
    row.as_ref().map(task_from_row).transpose()
}

/// A task that must exist (it was just written in this transaction).
async fn fetch_id(tx: &mut Transaction<'static, MySql>, id: TaskId) -> Result<TaskRecord> {
    fetch_ref(&mut **tx, &TaskRef::Id(id), Lock::No)
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

/// One attempt at each write; [`retrying`] runs them again after a lock conflict.
impl MySqlStorage {
    /// Insert tasks in one transaction, then wake this process's workers if any is new.
    async fn insert_once(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
    ) -> Result<Vec<TaskInsertOutcome>> {
        Ok(self
            .insert_checked_once(tasks, now, &|_| true)
            .await?
            .outcomes)
    }

    /// Insert tasks in one transaction that commits only if `accept` takes the outcomes
    /// (else it is rolled back), then wake this process's workers if a committed task
    /// is new.
    async fn insert_checked_once(
        &self,
        tasks: &[TaskInsertParams],
        now: Option<DateTime<Utc>>,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        let mut tx = self.begin().await?;
        let outcomes = insert::insert_many(&mut tx, tasks, now, None).await?;
        if !accept(&outcomes) {
            tx.rollback().await.map_err(map_err)?;
            return Ok(TaskInsertManyChecked {
                outcomes,
                committed: false,
            });
        }
        tx.commit().await.map_err(map_err)?;
        if outcomes.iter().any(TaskInsertOutcome::created) {
            self.wake();
        }
        Ok(TaskInsertManyChecked {
            outcomes,
            committed: true,
        })
    }
}

#[async_trait]
impl Storage for MySqlStorage {
    fn backend(&self) -> &'static str {
        "mysql"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            cross_process_wakeups: self.wake.cross_process(),
        }
    }

    async fn migrate(&self) -> Result<()> {
        self.check_trigger_privilege().await?;
        // sqlx's MySQL migrator holds GET_LOCK while it migrates: nodes starting
        // together migrate once, the others wait and find the work done.
        migrator()
            .run(&self.pool)
            .await
            .map_err(|e| StorageError::Migration(e.to_string()))
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        sqlx::query_scalar("SELECT UTC_TIMESTAMP(6)")
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    fn wakeups(&self) -> WakeReceiver {
        self.wake.subscribe()
    }

    async fn task_insert(&self, params: &TaskInsertParams) -> Result<TaskInserted> {
        validate_insert(params)?;
        let tasks = std::slice::from_ref(params);
        let mut outcomes = retrying(|| self.insert_once(tasks, params.now)).await?;
        outcomes
            .pop()
            .ok_or_else(|| StorageError::NotFound(params.task_no.to_string()))?
            .into_inserted()
    }

    async fn task_get(&self, task: &TaskRef) -> Result<Option<TaskRecord>> {
        fetch_ref(&self.pool, task, Lock::No).await
    }

    async fn task_list(&self, params: &TaskListParams) -> Result<Vec<TaskRecord>> {
        let columns = crate::common::list_columns(TASK_COLUMNS, params.value_max_bytes);
        let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM tenax_tasks WHERE TRUE"));
        if let Some(status) = params.status {
            qb.push(" AND status = ").push_bind(status.as_str());
        }
        if let Some(command_type) = &params.command_type {
            qb.push(" AND command_type = ")
                .push_bind(command_type.as_str());
        }
        if let Some(queue) = &params.queue {
            qb.push(" AND queue = ").push_bind(queue.as_str());
        }
        if let Some(before) = params.before_id {
            qb.push(" AND id < ").push_bind(before.0);
        }
        if let Some(started_before) = params.started_before {
            qb.push(" AND started_at < ")
                .push_bind(storable(started_before));
        }
        if let Some(created_after) = params.created_after {
            qb.push(" AND created_at >= ")
                .push_bind(storable(created_after));
        }
        if let Some(created_before) = params.created_before {
            qb.push(" AND created_at < ")
                .push_bind(storable(created_before));
        }
        qb.push(" ORDER BY id DESC LIMIT ")
            .push_bind(i64::from(params.limit));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }

    async fn task_attempts(&self, id: TaskId) -> Result<Vec<AttemptRecord>> {
        let rows = sqlx::query(
            "SELECT task_id, epoch, attempt, worker, started_at, finished_at, outcome, error
             FROM tenax_attempts WHERE task_id = ? ORDER BY epoch",
        )
        .bind(id.0)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(rows::attempt_from_row).collect()
    }

    async fn task_claim_batch(&self, params: &TaskClaimParams) -> Result<Vec<TaskRecord>> {
        if offers_nothing(params) {
            return Ok(Vec::new());
        }
        crate::rates::claim(self, params).await
    }

    async fn lease_extend(&self, params: &LeaseExtendParams) -> Result<Vec<Lease>> {
        if params.leases.is_empty() {
            return Ok(Vec::new());
        }
        retrying(|| self.lease_extend_once(params)).await
    }

    async fn task_complete_if_leased(&self, params: &TaskCompleteParams) -> Result<bool> {
        let params = &*crate::common::storable_completion(params);
        retrying(|| self.complete_once(params)).await
    }

    async fn task_fail_if_leased(&self, params: &TaskFailParams) -> Result<bool> {
        let error = truncate_error(&params.error);
        retrying(|| self.fail_once(params, &error)).await
    }

    async fn task_reap_expired(&self, params: &TaskReapParams) -> Result<Vec<ReapedTask>> {
        if params.limit == 0 {
            return Ok(Vec::new());
        }
        retrying(|| self.reap_once(params)).await
    }

    async fn task_cancel(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        retrying(|| self.cancel_once(params)).await
    }

    async fn task_retry(&self, params: &TaskActionParams) -> Result<TaskRecord> {
        retrying(|| self.retry_once(params)).await
    }

    async fn side_prune(&self, params: &crate::SidePruneParams) -> Result<crate::SidePruned> {
        self.side_prune_impl(params).await
    }

    async fn task_prune(&self, params: &TaskPruneParams) -> Result<u64> {
        if params.limit == 0 {
            return Ok(0);
        }
        retrying(|| self.prune_once(params)).await
    }

    async fn queue_list(&self) -> Result<Vec<QueueInfo>> {
        self.queue_list_impl().await
    }

    async fn queue_update(&self, params: &QueueUpdateParams) -> Result<QueueInfo> {
        self.queue_update_impl(params).await
    }

    async fn rate_limit_set(&self, params: &RateLimitSetParams) -> Result<RateLimit> {
        self.rate_limit_set_impl(params).await
    }

    async fn rate_limit_list(&self) -> Result<Vec<RateLimit>> {
        self.rate_limit_list_impl().await
    }

    async fn rate_limit_remove(&self, command_type: &str) -> Result<()> {
        self.rate_limit_remove_impl(command_type).await
    }

    async fn stats(&self) -> Result<Stats> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let by_type_rows = sqlx::query(
            "SELECT command_type, status, COUNT(*) AS n FROM tenax_tasks
             GROUP BY command_type, status ORDER BY command_type, status",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
        let mut stats = Stats::default();
        for row in &by_type_rows {
            let command_type: Vec<u8> = row.try_get("command_type").map_err(map_err)?;
            let command_type = String::from_utf8(command_type)
                .map_err(|_| StorageError::Corrupt("command_type is not UTF-8".into()))?;
            let status: Vec<u8> = row.try_get("status").map_err(map_err)?;
            let status: TaskStatus = String::from_utf8_lossy(&status).parse()?;
            let n: i64 = row.try_get("n").map_err(map_err)?;
            let n = u64::try_from(n).unwrap_or(0);
            stats.by_type.push((command_type, status, n));
            match stats.by_status.iter_mut().find(|(s, _)| *s == status) {
                Some((_, total)) => *total += n,
                None => stats.by_status.push((status, n)),
            }
        }
        stats.by_status.sort();
        let row = sqlx::query(
            "SELECT MIN(run_at) AS oldest, UTC_TIMESTAMP(6) AS now FROM tenax_tasks
             WHERE status IN ('pending', 'retrying') AND run_at <= UTC_TIMESTAMP(6)",
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        let oldest: Option<DateTime<Utc>> = row.try_get("oldest").map_err(map_err)?;
        let now: DateTime<Utc> = row.try_get("now").map_err(map_err)?;
        stats.oldest_due_age = oldest.map(|oldest| (now - oldest).to_std().unwrap_or_default());
        Ok(stats)
    }

    async fn task_next_run_at(&self, params: &TaskNextRunParams) -> Result<Option<NextRun>> {
        runtime::next_run_at(&self.pool, params).await
    }

    async fn queue_backlog(&self, params: &QueueBacklogParams) -> Result<Vec<QueueBacklog>> {
        runtime::queue_backlog(&self.pool, params).await
    }

    async fn task_cancel_requested(&self, params: &CancelRequestedParams) -> Result<Vec<Lease>> {
        runtime::cancel_requested(&self.leases, params).await
    }

    async fn schedule_upsert(
        &self,
        params: &ScheduleUpsertParams,
    ) -> Result<(ScheduleRecord, ScheduleUpserted)> {
        self.schedule_upsert_tx(params).await
    }

    async fn schedule_list(&self) -> Result<Vec<ScheduleRecord>> {
        self.schedule_list_all().await
    }

    async fn schedule_set_paused(&self, params: &SchedulePauseParams) -> Result<ScheduleRecord> {
        self.schedule_pause_tx(params).await
    }

    async fn schedule_remove(&self, name: &str) -> Result<()> {
        self.schedule_delete(name).await
    }

    async fn schedule_fire_due(&self, params: &ScheduleFireParams) -> Result<Vec<FiredTick>> {
        self.schedule_fire_tx(params).await
    }

    async fn queue_stats(&self, params: &QueueStatsParams) -> Result<Vec<QueueStats>> {
        queue_stats::queue_stats(&self.pool, params.now).await
    }
    async fn task_bulk(&self, params: &TaskBulkParams) -> Result<TaskBulkOutcome> {
        self.task_bulk_impl(params).await
    }

    async fn audit_append(&self, params: &AuditAppendParams) -> Result<AuditRecord> {
        retrying(|| self.audit_append_impl(params)).await
    }

    async fn audit_list(&self, params: &AuditListParams) -> Result<Vec<AuditRecord>> {
        self.audit_list_impl(params).await
    }

    async fn task_insert_many(
        &self,
        params: &TaskInsertManyParams,
    ) -> Result<Vec<TaskInsertOutcome>> {
        crate::common::validate_many(&params.tasks)?;
        retrying(|| self.insert_once(&params.tasks, params.now)).await
    }

    async fn task_insert_many_if(
        &self,
        params: &TaskInsertManyParams,
        accept: &InsertAccept<'_>,
    ) -> Result<TaskInsertManyChecked> {
        crate::common::validate_many(&params.tasks)?;
        retrying(|| self.insert_checked_once(&params.tasks, params.now, accept)).await
    }

    async fn workflow_insert(&self, params: &WorkflowInsertParams) -> Result<WorkflowDetail> {
        let detail = retrying(|| async {
            let mut tx = self.begin().await?;
            let detail = flow::insert(&mut *tx, params).await?;
            tx.commit().await.map_err(map_err)?;
            Ok(detail)
        })
        .await?;
        self.wake();
        Ok(detail)
    }

    async fn workflow_get(&self, id: WorkflowId) -> Result<Option<WorkflowDetail>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::get(&mut *conn, id).await
    }

    async fn workflow_list(&self, params: &WorkflowListParams) -> Result<Vec<WorkflowRecord>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        flow::list(&mut *conn, params).await
    }

    async fn task_parent_results(&self, id: TaskId) -> Result<Vec<ParentOutcome>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::parent_results(&mut conn, id).await
    }

    async fn outbox_claim(&self, params: &OutboxClaimParams) -> Result<Vec<OutboxRecord>> {
        retrying(|| self.outbox_claim_impl(params)).await
    }

    async fn outbox_settle(&self, params: &OutboxSettleParams) -> Result<u64> {
        retrying(|| self.outbox_settle_impl(params)).await
    }

    async fn outbox_list(&self, params: &OutboxListParams) -> Result<Vec<OutboxRecord>> {
        self.outbox_list_impl(params).await
    }

    async fn alert_transition(&self, params: &crate::AlertTransitionParams) -> Result<bool> {
        retrying(|| self.alert_transition_impl(params)).await
    }

    async fn outbox_senders_seen(&self, params: &crate::OutboxSendersParams) -> Result<()> {
        retrying(|| self.outbox_senders_seen_impl(params)).await
    }

    async fn outbox_prune(&self, params: &OutboxPruneParams) -> Result<u64> {
        self.outbox_prune_impl(params).await
    }
    async fn task_workflow(&self, id: TaskId) -> Result<Option<WorkflowId>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        workflows::task_workflow(&mut conn, id).await
    }

    async fn task_list_finished(&self, params: &TaskListFinishedParams) -> Result<Vec<TaskRecord>> {
        // A range of the (status, finished_at) index per status.
        // Only times and statuses are charted: payloads and results stay in the database.
        let columns = crate::common::list_columns(TASK_COLUMNS, Some(0));
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM tenax_tasks
             WHERE status IN ('succeeded', 'dead') AND finished_at >= ?
             ORDER BY finished_at DESC
             LIMIT ?"
        ))
        .bind(storable(params.since))
        .bind(i64::from(params.limit))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter().map(task_from_row).collect()
    }
    async fn task_complete_many_if_leased(
        &self,
        params: &[TaskCompleteParams],
    ) -> Result<Vec<BatchCompletion>> {
        let params = &*crate::common::storable_completions(params);
        crate::common::check_complete_many(params)?;
        if params.is_empty() {
            return Ok(Vec::new());
        }
        let repeated = crate::common::repeated_leases(params);
        retrying(|| self.complete_many_once(params, &repeated)).await
    }

    async fn outbox_stats(
        &self,
        params: &crate::OutboxStatsParams,
    ) -> Result<Vec<crate::OutboxStat>> {
        retrying(|| self.outbox_stats_impl(params)).await
    }

    async fn task_due_count(&self, params: &crate::TaskDueCountParams) -> Result<crate::DueCount> {
        runtime::due_count(&self.pool, params).await
    }

    async fn event_rule_set(&self, params: &crate::EventRuleParams) -> Result<bool> {
        self.event_rule_set_impl(params).await
    }

    async fn event_rule_list(&self) -> Result<Vec<crate::EventRule>> {
        self.event_rule_list_impl().await
    }

    async fn event_lease(
        &self,
        params: &crate::EventLeaseParams,
    ) -> Result<Option<crate::EventLease>> {
        self.event_lease_impl(params).await
    }

    async fn event_sequence(&self, params: &crate::EventSequenceParams) -> Result<Option<u64>> {
        self.event_sequence_impl(params).await
    }

    async fn event_cursor_advance(&self, params: &crate::EventCursorParams) -> Result<bool> {
        self.event_cursor_advance_impl(params).await
    }

    async fn event_list(&self, params: &crate::EventListParams) -> Result<crate::EventPage> {
        self.event_list_impl(params).await
    }

    async fn event_prune(&self, params: &crate::EventPruneParams) -> Result<u64> {
        self.event_prune_impl(params).await
    }
}
